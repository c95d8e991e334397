"""The claim reads the head of its partial indexes, whatever piles up behind it."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import psycopg.sql
import pytest

import leaseq
from leaseq._db import SERVICE_OPTIONS

#: Plans read after VACUUM: never beside a test that holds a snapshot open on purpose.
pytestmark = pytest.mark.xdist_group("cleanup_horizon")


def _nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", []):
        yield from _nodes(child)


def _scan_buffers(plan: dict[str, Any], cte: str) -> int:
    """Pages read by one of the claim's candidate scans (not by the row updates)."""
    (node,) = [n for n in _nodes(plan) if n.get("Subplan Name") == f"CTE {cte}"]
    return int(node["Shared Hit Blocks"] + node["Shared Read Blocks"])


def _explain(queue: leaseq.Queue, operation: Any, *, analyze: bool) -> dict[str, Any]:
    """The plan of the operation's last statement, after the ones before it (a
    search's plan settings) in the same transaction."""
    *before, statement = operation.statements
    options = "ANALYZE, BUFFERS, FORMAT JSON" if analyze else "FORMAT JSON"
    with queue.connection() as conn, conn.transaction(force_rollback=True):
        for setting in before:
            conn.execute(setting.sql)
        row = conn.execute(f"EXPLAIN ({options}) {statement.sql}", statement.params).fetchone()
    assert row is not None
    plan: dict[str, Any] = row[0][0]["Plan"]
    return plan


def _explain_on(conn: psycopg.Connection[Any], operation: Any) -> dict[str, Any]:
    """EXPLAIN ANALYZE of ``operation`` on ``conn``, rolled back."""
    (statement,) = operation.statements
    with conn.transaction(force_rollback=True):
        row = conn.execute(
            f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {statement.sql}", statement.params
        ).fetchone()
    assert row is not None
    plan: dict[str, Any] = row[0][0]["Plan"]
    return plan


def _generic_plan(queue: leaseq.Queue, operation: Any) -> dict[str, Any]:
    """``operation`` as the worker's claim session runs it (SERVICE_OPTIONS: a
    generic plan, no JIT), measured by EXPLAIN ANALYZE, then rolled back: the
    whole EXPLAIN document (its "Plan", and "JIT" when it compiled)."""
    (statement,) = operation.statements
    with (
        psycopg.connect(queue.dsn, **SERVICE_OPTIONS) as conn,
        conn.transaction(force_rollback=True),
    ):
        conn.execute(statement.sql, statement.params, prepare=True)
        explain = psycopg.sql.SQL("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) ")
        row = conn.execute(explain + _execute(_last_prepared(conn), statement)).fetchone()
    assert row is not None
    document: dict[str, Any] = row[0][0]
    return document


def _job_scans(plan: dict[str, Any]) -> dict[str, str]:
    """The plan's reads of the job table: index name (the node type for a scan
    without one) -> node type."""
    return {
        node.get("Index Name", node["Node Type"]): node["Node Type"]
        for node in _nodes(plan)
        if node.get("Relation Name") == "job" and node["Node Type"] != "ModifyTable"
    }


@pytest.fixture
def finished_rows(queue: leaseq.Queue) -> leaseq.Queue:
    """100,000 done and failed rows, a few ready jobs and a few running leases."""
    queue.enqueue_many("reports", [{"n": n} for n in range(5)])
    queue.claim("reports", limit=2, lease=600)
    with queue.connection() as conn:
        conn.execute(
            f'INSERT INTO "{queue.schema}".job (queue, payload, payload_bytes, status,'
            "  available_at, max_attempts, attempts, lease_version, finished_at)"
            " SELECT 'reports', jsonb_build_object('n', i), 10,"
            "  CASE WHEN i % 10 = 0 THEN 'failed' ELSE 'done' END,"
            "  now() - interval '1 hour', 20, 1, 1, now()"
            " FROM generate_series(1, 100000) AS i"
        )
        conn.execute(f'VACUUM ANALYZE "{queue.schema}".job')
    return queue


def test_claim_uses_the_partial_indexes(finished_rows: leaseq.Queue) -> None:
    plan = _explain(finished_rows, finished_rows._store.claim("reports", limit=10), analyze=False)
    scans = _job_scans(plan)
    assert "job_ready_idx" in scans, scans
    assert "job_lease_idx" in scans, scans
    assert all(kind != "Seq Scan" for kind in scans.values()), scans


def test_a_search_of_failed_jobs_reads_their_index_not_the_table(
    finished_rows: leaseq.Queue,
) -> None:
    """A search of failed jobs is not bounded by a window of job ids (failed jobs
    stay however old): it reads the newest failures of each queue from
    job_failed_idx alone, then the rows of the page by primary key."""
    # An index-only scan skips the heap only for pages vacuum marked all-visible,
    # which a transaction open elsewhere (another test's) may keep it from doing.
    _vacuum_until_all_visible(finished_rows)
    for filters in ({}, {"queue": "reports"}, {"queue": "reports", "error": "nothing like it"}):
        operation = finished_rows._store.find_jobs(status="failed", limit=50, **filters)
        plan = _explain(finished_rows, operation, analyze=True)
        scans = _job_scans(plan)
        assert scans.get("job_failed_idx") == "Index Only Scan", (filters, scans)
        assert all(kind != "Seq Scan" for kind in scans.values()), (filters, scans)
        blocks = plan["Shared Hit Blocks"] + plan["Shared Read Blocks"]
        # 10,000 failed rows of 100,000: a scan of the table would read ~1,000 pages.
        limit = 200 if not filters.get("error") else 40_000
        assert blocks < limit, (filters, blocks)


@pytest.mark.parametrize("rows", ["never analyzed", "100k finished", "100k queued"])
def test_the_claims_generic_plan_reads_the_heads_of_the_partial_indexes(
    queue: leaseq.Queue, rows: str, request: pytest.FixtureRequest
) -> None:
    """The worker's claim session keeps one generic plan per statement, made
    whenever the worker starts: on a table never analyzed, over 100,000 finished
    rows or 100,000 queued jobs, it reads the heads of the partial indexes (never
    the table), and nothing is compiled (a generic plan does not see the LIMIT:
    its estimated cost over a large backlog is the whole backlog's)."""
    if rows == "100k finished":
        queue = request.getfixturevalue("finished_rows")
    elif rows == "100k queued":
        queue.enqueue_many("reports", [{"n": n} for n in range(100_000)])
        with queue.connection() as conn:
            conn.execute(f'VACUUM ANALYZE "{queue.schema}".job')
    document = _generic_plan(queue, queue._store.claim("reports", limit=10))
    plan = document["Plan"]
    scans = _job_scans(plan)
    assert "job_ready_idx" in scans, scans
    assert "job_lease_idx" in scans, scans
    assert all(kind != "Seq Scan" for kind in scans.values()), scans
    assert "JIT" not in document
    assert plan["Shared Hit Blocks"] + plan["Shared Read Blocks"] < 200


def test_claim_reads_a_handful_of_pages_over_100k_finished_rows(
    finished_rows: leaseq.Queue,
) -> None:
    plan = _explain(finished_rows, finished_rows._store.claim("reports", limit=3), analyze=True)
    touched = plan["Shared Hit Blocks"] + plan["Shared Read Blocks"]
    assert plan["Actual Rows"] == 3
    # 100,000 finished rows span ~1,000 pages: the claim must not visit them.
    assert touched < 100, touched
    assert _scan_buffers(plan, "ready") < 30
    assert _scan_buffers(plan, "expired") < 30


def test_ordered_claim_uses_the_ordering_index(finished_rows: leaseq.Queue) -> None:
    queue = finished_rows
    queue.enqueue_many("reports", [{"n": n} for n in range(3)], key="customer-1")
    plan = _explain(queue, queue._store.claim("reports", limit=10), analyze=True)
    index_names = {node.get("Index Name") for node in _nodes(plan)}
    assert "job_ordering_idx" in index_names, index_names
    touched = plan["Shared Hit Blocks"] + plan["Shared Read Blocks"]
    assert touched < 200, touched


def test_claim_stops_at_the_head_of_a_large_ready_backlog(queue: leaseq.Queue) -> None:
    """50,000 ready jobs over several priorities: the claim still reads a few pages."""
    with queue.connection() as conn:
        queue.enqueue("reports", {"seed": True})
        conn.execute(
            f'INSERT INTO "{queue.schema}".job (queue, payload, payload_bytes, priority,'
            "  available_at, max_attempts)"
            " SELECT 'reports', jsonb_build_object('n', i), 10, (i % 3)::smallint,"
            "  now() - (i || ' seconds')::interval, 20"
            " FROM generate_series(1, 50000) AS i"
        )
        conn.execute(f'VACUUM ANALYZE "{queue.schema}".job')
    plan = _explain(queue, queue._store.claim("reports", limit=10), analyze=True)
    assert plan["Actual Rows"] == 10
    # The ready branch reads the index in order: no sort of the backlog. (The
    # claim's result is put in claim order at the end: a sort of its 10 rows.)
    (ready,) = [n for n in _nodes(plan) if n.get("Subplan Name") == "CTE ready"]
    assert not any(node["Node Type"] == "Sort" for node in _nodes(ready)), ready
    sorts = [node for node in _nodes(plan) if node["Node Type"] == "Sort"]
    assert all(node["Actual Rows"] <= 10 for node in sorts), sorts
    # Reading the head of the index: a handful of pages, not the 50,000 rows.
    assert _scan_buffers(plan, "ready") < 30, _scan_buffers(plan, "ready")
    # And it takes the most urgent, oldest jobs.
    claims = queue.claim("reports", limit=3)
    assert [c.payload["n"] for c in claims] == [50000, 49997, 49994]  # in claim order


def _vacuum_until_all_visible(queue: leaseq.Queue, timeout: float = 60.0) -> None:
    """VACUUM until the visibility map covers the job table (but a page or so: the
    fixture's running jobs, their rows just updated): rows inserted while another
    test's transaction was open are not visible to all until it ends."""
    deadline = time.monotonic() + timeout
    with queue.connection() as conn:
        while True:
            conn.execute(f'VACUUM ANALYZE "{queue.schema}".job')
            row = conn.execute(
                "SELECT relallvisible, relpages FROM pg_class WHERE oid = %s::regclass",
                (f'"{queue.schema}".job',),
            ).fetchone()
            assert row is not None
            if row[0] >= 0.99 * row[1]:
                return
            if time.monotonic() > deadline:
                pytest.fail(f"the job table stayed partly not all-visible: {row}")
            time.sleep(0.3)


def _vacuum_until_clean(queue: leaseq.Queue, timeout: float = 60.0) -> None:
    """VACUUM ANALYZE until it leaves no dead tuple behind: while a transaction that
    began before the claims runs anywhere in the database (another test's bulk
    insert), vacuum may not remove the claimed rows' old versions, and the plan would
    read them. VACUUM VERBOSE says how many it had to leave."""
    deadline = time.monotonic() + timeout
    with queue.connection() as conn:
        notices: list[str] = []
        conn.add_notice_handler(lambda notice: notices.append(notice.message_primary or ""))
        while True:
            notices.clear()
            conn.execute(f'VACUUM (VERBOSE, ANALYZE) "{queue.schema}".job')
            left = [
                int(m.group(1))
                for n in notices
                for m in [re.search(r"(\d+) are dead but not yet removable", n)]
                if m
            ]
            if left and sum(left) == 0:
                return
            if time.monotonic() > deadline:
                pytest.fail(f"vacuum left dead tuples for {timeout}s: {left} {notices[:3]}")
            time.sleep(0.3)


def _keyed_backlog(queue: leaseq.Queue, keys: int, per_key: int) -> list[int]:
    """``keys`` ordering keys with ``per_key`` queued jobs each, then plain jobs."""
    for k in range(keys):
        queue.enqueue_many("events", [{"k": k, "n": n} for n in range(per_key)], key=f"key-{k}")
    plain = queue.enqueue_many("events", [{"plain": n} for n in range(1000)])
    queue.enqueue_many("baseline", [{"plain": n} for n in range(1000)])
    with queue.connection() as conn:
        conn.execute(f'VACUUM ANALYZE "{queue.schema}".job')
    return plain


def _claim_cost(queue: leaseq.Queue, limit: int) -> tuple[int, int]:
    """(rows claimed, pages touched) of one claim, measured, then rolled back.

    Measured the second time: the first run of a session also reads the system
    catalogs whose caches the session lacks (the triggers' functions, a cache
    reset after other tests' DDL), tens of pages that are not the claim's own.
    (The rolled-back first run leaves its dead index entries behind: if anything
    the second run reads more of the job table, not less.)"""
    operation = queue._store.claim("events", limit=limit)
    with queue.connection() as conn:
        for _ in range(2):
            plan = _explain_on(conn, operation)
    claimed = next(n for n in _nodes(plan) if n.get("Subplan Name") == "CTE claimed")
    return int(claimed["Actual Rows"]), int(plan["Shared Hit Blocks"] + plan["Shared Read Blocks"])


@pytest.mark.parametrize(("keys", "per_key"), [(1, 100_000), (1000, 100)])
def test_claim_cost_does_not_grow_with_a_keys_waiting_jobs(
    queue: leaseq.Queue, keys: int, per_key: int
) -> None:
    """100,000 queued jobs of one key, or spread over 1,000 keys, with plain jobs
    behind them: a claim reads the heads, never the waiting successors."""
    plain = _keyed_backlog(queue, keys, per_key)
    rows, touched = _claim_cost(queue, limit=1)
    assert rows == 1
    assert touched < 50, touched
    # With every key's head running, the plain jobs behind the keyed backlog
    # are next, and the claim still does not read the waiting successors.
    heads = queue.claim("events", limit=keys, lease=600)
    assert sorted(c.key for c in heads) == sorted(f"key-{k}" for k in range(keys))
    _vacuum_until_clean(queue)
    plan = _explain(queue, queue._store.claim("events", limit=10), analyze=True)
    assert _scan_buffers(plan, "ready") < 30, _scan_buffers(plan, "ready")
    # The whole claim (its ten row updates included) costs what the same claim
    # costs in a queue that never had an ordering key.
    baseline = _explain(queue, queue._store.claim("baseline", limit=10), analyze=True)
    keyed, plain_only = (p["Shared Hit Blocks"] + p["Shared Read Blocks"] for p in (plan, baseline))
    # Within a quarter plus 30 pages: what the ten row updates touch varies with
    # where their new versions land (a fresh heap page, a b-tree page split), on
    # any queue; reading the 100,000 waiting successors would cost thousands.
    assert keyed <= plain_only * 1.25 + 30, (keyed, plain_only)
    assert {c.job_id for c in queue.claim("events", limit=10)} <= set(plain)


@pytest.fixture
def stale_statistics(queue: leaseq.Queue) -> list[leaseq.Claim]:
    """5,000 running leases that the table's statistics have never seen: analyzed
    while every job was still queued (what an autovacuum analyze leaves behind
    before a burst of claims)."""
    queue.enqueue_many("reports", [{"n": n} for n in range(5000)])
    with queue.connection() as conn:
        conn.execute(f'VACUUM ANALYZE "{queue.schema}".job')
    return queue.claim("reports", limit=5000, lease=600)


def test_fenced_writes_find_each_claim_by_its_key_whatever_the_statistics_say(
    queue: leaseq.Queue, stale_statistics: list[leaseq.Claim]
) -> None:
    """A fenced write of ten claims reads those ten rows, never every running
    job's lease: its cost must not grow with how many jobs run."""
    batch = stale_statistics[100:110]
    store = queue._store
    operations = {
        "renew": store.renew(batch),
        "renew_one": store.renew_one(batch[0]),
        "complete": store.complete(batch),
        "complete_one": store.complete_one(batch[0]),
        "retry": store.retry(batch, delays=[1.0] * 10, errors=["e"] * 10),
        "fail": store.fail(batch, ["e"] * 10),
        "release": store.release(batch),
    }
    for name, operation in operations.items():
        plan = _explain(queue, operation, analyze=True)
        touched = plan["Shared Hit Blocks"] + plan["Shared Read Blocks"]
        lease_scans = [n for n in _nodes(plan) if n.get("Index Name") == "job_lease_idx"]
        # Ten rows, their indexes and the triggers' reads: tens of pages. The
        # lease index of 5,000 running jobs alone spans more than 30 pages.
        assert not lease_scans, (name, lease_scans)
        assert touched < 300, (name, touched)


def test_a_fenced_batch_does_a_few_rows_of_work_per_claim_whatever_its_size(
    queue: leaseq.Queue,
) -> None:
    """A batch of N claims (the worker acknowledges up to 500 at once) must cost
    each claim a handful of rows in every plan node, never a pass over the whole
    batch: work of N x N rows in one node makes the batch's cost grow with the
    square of its size. Measured as the worker's sessions run these statements
    (generic plans; no hash or merge joins)."""
    size = 200
    queue.enqueue_many("reports", [{"n": n} for n in range(size)])
    batch = queue.claim("reports", limit=size, lease=600)
    assert len(batch) == size
    # For the claim, run twice (its generic plan is made by a first, real call).
    queue.enqueue_many("reports", [{"n": n} for n in range(2 * size)])
    store = queue._store
    operations = {
        "claim": store.claim("reports", limit=size, lease=None),
        "enqueue_many": store.enqueue_many("reports", [{"n": n} for n in range(size)]),
        "renew": store.renew(batch),
        "complete": store.complete(batch),
        "complete, strict": store.complete(batch, strict=True),
        "retry": store.retry(batch, delays=[1.0] * size, errors=["e"] * size),
        "fail": store.fail(batch, ["e"] * size),
        "release": store.release(batch),
    }
    quadratic = []
    for name, operation in operations.items():
        plan = _generic_plan(queue, operation)["Plan"]
        for node in _nodes(plan):
            # Per-loop figures (EXPLAIN averages them over the node's loops).
            per_loop = (
                node["Actual Rows"]
                + node.get("Rows Removed by Filter", 0)
                + node.get("Rows Removed by Join Filter", 0)
            )
            rows = per_loop * node["Actual Loops"]
            if rows > 4 * size:
                quadratic.append((name, node["Node Type"], node.get("Alias"), rows))
    assert not quadratic


def test_the_workers_plans_made_on_a_young_table_still_read_by_key_once_it_grew(
    queue: leaseq.Queue,
) -> None:
    """The worker's sessions keep one generic plan per statement, made at its
    first call: often on a new, nearly empty job table. Once the table holds
    20,000 more rows (no VACUUM or ANALYZE since: nothing replans), each of
    those plans must still read a handful of pages, never the whole table."""
    schema = queue.schema
    with queue.connection() as conn:  # nothing may replan behind the test's back
        conn.execute(f'ALTER TABLE "{schema}".job SET (autovacuum_enabled = false)')
    queue.enqueue_many("reports", [{"n": n} for n in range(14)])
    claims = queue.claim("reports", limit=12, lease=600)
    store = queue._store
    operations = {
        "claim": store.claim("reports", limit=2, lease=None),
        "renew": store.renew(claims[:2]),
        "complete": store.complete(claims[2:4]),
        "retry": store.retry(claims[4:6], delays=[1.0] * 2, errors=["e"] * 2),
        "fail": store.fail(claims[6:8], ["e"] * 2),
        "release": store.release(claims[8:10]),
    }
    with psycopg.connect(queue.dsn, **SERVICE_OPTIONS) as session:
        prepared: dict[str, tuple[str, Any]] = {}
        for name, operation in operations.items():
            (statement,) = operation.statements
            # Run once (for real: the claims are the test's own), as the worker's
            # session does: its generic plan is made now, on the young table, and kept.
            session.execute(statement.sql, statement.params, prepare=True)
            prepared_name = _last_prepared(session)
            prepared[name] = (prepared_name, _execute(prepared_name, statement))
        queue.enqueue_many("reports", [{"n": n} for n in range(20_000)])
        with queue.connection() as conn:  # most of them finished, as in a busy queue
            conn.execute(
                f"UPDATE \"{schema}\".job SET status = 'done', finished_at = now()"
                " WHERE status = 'queued' AND (payload->>'n')::int >= 1000"
            )
        plans = {}
        # One transaction, rolled back: the driver forgets its prepared
        # statements at a rollback (the server's stay; it would prepare anew).
        with session.transaction(force_rollback=True):
            for name, (_, execute) in prepared.items():
                explain = psycopg.sql.SQL("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) ") + execute
                row = session.execute(explain).fetchone()
                assert row is not None
                plans[name] = row[0][0]["Plan"]
        for name, plan in plans.items():
            whole_table = [
                n["Node Type"]
                for n in _nodes(plan)
                if n.get("Relation Name") == "job" and n["Node Type"] == "Seq Scan"
            ]
            touched = plan["Shared Hit Blocks"] + plan["Shared Read Blocks"]
            assert not whole_table, (name, whole_table)
            # The table now spans hundreds of pages; a keyed read, tens.
            assert touched < 300, (name, touched)


def _last_prepared(conn: psycopg.Connection[Any]) -> str:
    """The name of the statement the driver prepared last on ``conn``."""
    row = conn.execute(
        "SELECT name FROM pg_prepared_statements ORDER BY prepare_time DESC LIMIT 1"
    ).fetchone()
    assert row is not None
    name: str = row[0]
    return name


def _execute(prepared_name: str, statement: Any) -> psycopg.sql.Composed:
    """``EXECUTE name(...)``: EXPLAIN EXECUTE takes no bound parameters, so the
    statement's values go in as literals, in the order the driver numbered its
    placeholders (the order they first appear)."""
    names = list(dict.fromkeys(re.findall(r"%\((\w+)\)[sb]", statement.sql)))
    arguments = psycopg.sql.SQL(", ").join(psycopg.sql.Literal(statement.params[n]) for n in names)
    name = psycopg.sql.Identifier(prepared_name)
    return psycopg.sql.SQL("EXECUTE {}({})").format(name, arguments)


def test_the_reaper_reads_its_index_not_a_mostly_queued_table(queue: leaseq.Queue) -> None:
    """300,000 queued jobs, each retried once (their rows rewritten), none out of
    attempts. The planner takes a third of queued rows for exhausted: the reap,
    run by the maintenance leader every round, read the whole table."""
    with queue.connection() as conn:
        queue.enqueue("reports", {"seed": True})
        conn.execute(
            f'INSERT INTO "{queue.schema}".job (queue, payload, payload_bytes,'
            "  available_at, max_attempts)"
            " SELECT 'reports', jsonb_build_object('n', i), 10, now() + interval '1 hour', 20"
            " FROM generate_series(1, 300000) AS i"
        )
        conn.execute(
            f'UPDATE "{queue.schema}".job'
            " SET attempts = 1, available_at = available_at + interval '1 second'"
        )
        conn.execute(f'VACUUM ANALYZE "{queue.schema}".job')
    reap = queue._store.reap().statements[0]  # (then the holds' expiry)
    with queue.connection() as conn:
        plan = _explain_on(conn, leaseq._statement.Operation((reap,), lambda rows: rows))
    # The empty partial index: a page or two, not the table's ~10,000.
    assert _scan_buffers(plan, "exhausted_queued") < 50


def test_a_keyed_jobs_place_is_counted_without_walking_its_key(queue: leaseq.Queue) -> None:
    """A key of 100,000 jobs enqueued without seq= (all seq 0): get() of its head
    counts 0 ahead, of a job deep in it its true place; neither walks the key."""
    ids: list[int] = []
    for start in range(0, 100_000, 10_000):
        batch = [{"n": n} for n in range(start, start + 10_000)]
        ids += queue.enqueue_many("orders", batch, key="k")
    with queue.connection() as conn:
        conn.execute(f'VACUUM ANALYZE "{queue.schema}".job')
    assert queue.get(ids[0]).ahead == 0
    assert queue.get(ids[500]).ahead == 500
    (get,) = queue._store.get(ids[0]).statements
    with queue.connection() as conn, conn.transaction(force_rollback=True):
        # With the job id as a literal, as the dashboard's job page sends it.
        text = psycopg.ClientCursor(conn).mogrify(get.sql, get.params)
        row = conn.execute(f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {text}").fetchone()
    assert row is not None
    head = row[0][0]["Plan"]
    assert head["Shared Hit Blocks"] + head.get("Shared Read Blocks", 0) < 100


@pytest.mark.parametrize("delayed_priority", [0, 5], ids=["same", "higher"])
def test_a_claim_never_reads_the_jobs_that_wait(queue: leaseq.Queue, delayed_priority: int) -> None:
    """100,000 delayed jobs (a schedule, retries backing off during an outage) and
    3 ready ones: a claim asking for 10 read every waiting job of the queue (the
    ready index's time bound held under its first priority only)."""
    with queue.connection() as conn:
        conn.execute(
            f'INSERT INTO "{queue.schema}".job (queue, payload, payload_bytes, priority,'
            "  available_at, max_attempts)"
            " SELECT 'reports', jsonb_build_object('n', i), 10, %s,"
            "  now() + interval '1 day' + (i || ' seconds')::interval, 20"
            " FROM generate_series(1, 100000) AS i",
            (delayed_priority,),
        )
    ready = queue.enqueue_many("reports", [{"ready": n} for n in range(3)])
    with queue.connection() as conn:
        conn.execute(f'VACUUM ANALYZE "{queue.schema}".job')
    plan = _explain(queue, queue._store.claim("reports", limit=10), analyze=True)
    assert plan["Actual Rows"] == 3
    # The delayed jobs' index entries alone fill ~400 pages.
    assert _scan_buffers(plan, "ready") < 60
    assert sorted(c.job_id for c in queue.claim("reports", limit=10)) == sorted(ready)
    assert queue.claim("reports", limit=10) == []  # nothing ready: as cheap


def _pages_of_two_claims(queue: leaseq.Queue) -> list[int]:
    """The pages of the job table and its indexes each of two claims of 10 of
    'reports' read (the claim_limited() function's own queries included), in one
    transaction rolled back, after a VACUUM ANALYZE. Counted per relation by the
    server (this transaction's block requests), not from EXPLAIN's total, which
    also counts the catalog pages a replan reads: in a loaded parallel run other
    tests' DDL resets the session's caches, and the count swung by ~200 pages.
    Twice: the second reads what its queries read, with what the first took gone."""
    with queue.connection() as conn:
        conn.execute(f'VACUUM ANALYZE "{queue.schema}".job')
    (claim,) = queue._store.claim("reports", limit=10).statements
    blocks = (
        "SELECT sum(pg_stat_get_xact_blocks_fetched(r.oid))::bigint FROM pg_class AS r"
        " WHERE r.oid = %(job)s::regclass OR r.oid IN ("
        "   SELECT i.indexrelid FROM pg_index AS i WHERE i.indrelid = %(job)s::regclass)"
    )
    job = {"job": f'"{queue.schema}".job'}
    pages = []
    with queue.connection() as conn, conn.transaction(force_rollback=True):
        for _ in range(2):
            before = conn.execute(blocks, job).fetchone()
            conn.execute(claim.sql, claim.params).fetchall()
            after = conn.execute(blocks, job).fetchone()
            assert before is not None
            assert after is not None
            pages.append(after[0] - before[0])
    return pages


@pytest.mark.parametrize("group", [None, "acme"], ids=["limited", "grouped"])
def test_a_limited_claim_never_reads_the_jobs_that_wait(
    queue: leaseq.Queue, group: str | None
) -> None:
    """As test_a_claim_never_reads_the_jobs_that_wait, for a queue with a limit
    (claim_limited(), migration 0016): 100,000 delayed jobs at a higher priority
    than the 3 ready ones, which a claim of 10 walked."""
    queue.configure_queue("reports", max_running=1000)
    ready = queue.enqueue_many("reports", [{"ready": n} for n in range(3)], group=group)
    alone = _pages_of_two_claims(queue)[1]
    with queue.connection() as conn:
        conn.execute(
            f'INSERT INTO "{queue.schema}".job (queue, payload, payload_bytes, priority,'
            "  available_at, max_attempts, group_key)"
            " SELECT 'reports', jsonb_build_object('n', i), 10, 5,"
            "  now() + interval '1 day' + (i || ' seconds')::interval, 20, %s"
            " FROM generate_series(1, 100000) AS i",
            (group,),
        )
    # Every page the claim read, the function's own queries included, against
    # the same claim before the delayed jobs came: their index entries alone
    # fill ~400 pages, and a walk read ~700.
    pages = _pages_of_two_claims(queue)[1]
    assert pages - alone < 150, (alone, pages)
    assert sorted(c.job_id for c in queue.claim("reports", limit=10)) == sorted(ready)


def test_a_grouped_claim_never_visits_the_groups_whose_jobs_wait(queue: leaseq.Queue) -> None:
    """10,000 groups whose every job waits (each tenant's report scheduled for
    tomorrow, or its retries backing off through an outage) and one group with 3
    ready jobs: a claim took every group in turn, found nothing due in each, and
    read ~370,000 pages once the 3 were started; an idle worker's every poll did
    the same. The waiting groups must cost the claim nothing (migration 0017)."""
    # In the middle of the groups' order, and in a group that also waits.
    ready = queue.enqueue_many("reports", [{"ready": n} for n in range(3)], group="tenant-05000")
    alone = _pages_of_two_claims(queue)[1]
    with queue.connection() as conn:
        conn.execute(
            f'INSERT INTO "{queue.schema}".job (queue, payload, payload_bytes,'
            "  available_at, max_attempts, group_key)"
            " SELECT 'reports', jsonb_build_object('n', i), 10,"
            "  now() + interval '1 day' + (i || ' seconds')::interval, 20,"
            "  'tenant-' || lpad(i::text, 5, '0')"
            " FROM generate_series(1, 10000) AS i"
        )
    pages = _pages_of_two_claims(queue)[1]
    assert pages - alone < 150, (alone, pages)  # against the same claim before them
    assert sorted(c.job_id for c in queue.claim("reports", limit=10)) == sorted(ready)
    assert queue.claim("reports", limit=10) == []


@pytest.mark.parametrize("status", ["failed", "running"])
@pytest.mark.parametrize("queue_name", [None, "reports"], ids=["any queue", "one queue"])
def test_a_listing_of_failed_or_running_jobs_never_reads_the_newer_rows(
    queue: leaseq.Queue, status: str, queue_name: str | None
) -> None:
    """`leaseq failed` (list_jobs('failed')): 2,000 old failures (and a few
    running jobs) under 200,000 newer finished jobs. The planner, which takes
    1 % of the rows for failures spread evenly, read the primary key from its
    end, every newer row on the way (2.6 s at a million). The jobs that failed,
    and those running, are read through their own index."""
    with queue.connection() as conn:
        conn.execute(
            f'INSERT INTO "{queue.schema}".job (queue, payload, payload_bytes, status,'
            "  available_at, max_attempts, attempts, lease_version, finished_at, last_error)"
            " SELECT 'older', jsonb_build_object('n', i), 10, 'failed',"
            "  now() - interval '1 hour', 20, 1, 1, now(), 'boom'"
            " FROM generate_series(1, 2000) AS i"
        )
    queue.enqueue_many("reports", [{"n": n} for n in range(5)])
    running = queue.claim("reports", limit=2, lease=600)
    failing = queue.claim("reports", limit=3, lease=600)
    for claim in failing:
        queue.fail(claim, "boom")
    with queue.connection() as conn:
        conn.execute(
            f'INSERT INTO "{queue.schema}".job (queue, payload, payload_bytes, status,'
            "  available_at, max_attempts, attempts, lease_version, finished_at)"
            " SELECT 'reports', jsonb_build_object('n', i), 10, 'done',"
            "  now() - interval '1 hour', 20, 1, 1, now()"
            " FROM generate_series(1, 200000) AS i"
        )
    _vacuum_until_all_visible(queue)
    plan = _explain(queue, queue._store.list_jobs(status, queue=queue_name, limit=50), analyze=True)
    # Reading past the newer rows took ~5,500 pages; the 50 rows listed, each
    # found by its primary key, take ~4 each.
    assert plan["Shared Hit Blocks"] + plan.get("Shared Read Blocks", 0) < 300
    newest = sorted((c.job_id for c in (failing if status == "failed" else running)), reverse=True)
    listed = [j.job_id for j in queue.list_jobs(status, queue=queue_name, limit=50)]
    assert listed[: len(newest)] == newest
    assert len(listed) == (len(newest) if queue_name or status == "running" else 50)
    assert listed == sorted(listed, reverse=True)
    assert [j.job_id for j in queue.list_jobs(status, queue=queue_name, limit=1)] == newest[:1]
