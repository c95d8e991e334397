"""Every dashboard page over a job table of 1,000,000 finished rows reads a bounded
number of pages: the statements a page runs (recorded from its client) are
explained with ANALYZE and BUFFERS, and their pages summed, against a fixed budget
far below the table's size."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import pytest

import leaseq
from leaseq import _db
from leaseq._statement import Operation
from leaseq.web import create_app

#: Pages (8 KiB) one dashboard page may read in all its statements together. The
#: job table below is ~25,000 pages; reading it once would be 20 times this.
PAGE_BUDGET = 1500

FINISHED = 1_000_000


def _fill(queue: leaseq.Queue) -> None:
    """1,000,000 finished jobs over two days (97% done, 2% failed, 1% cancelled) in
    two queues, inserted in short batches, plus a few live jobs, a blocked key and
    an audit row; then VACUUM ANALYZE (the plans of a table that size)."""
    queue.enqueue_many("reports", [{"customer": "acme", "n": n} for n in range(20)])
    queue.enqueue("mail", {"to": "x"}, key="user:1", max_attempts=1)
    queue.enqueue_many("mail", [{"to": "x"}] * 3, key="user:1")
    (claim,) = queue.claim("mail")
    queue.fail(claim, "SMTPError: mailbox unavailable")
    queue.claim("reports", limit=3, lease=600)
    queue.configure_queue("reports", max_queued_jobs=100_000, actor="test")
    with queue.connection() as conn:
        for batch in range(10):
            conn.execute(
                f'INSERT INTO "{queue.schema}".job (queue, payload, payload_bytes, status,'
                "  available_at, max_attempts, attempts, lease_version, claimed_at,"
                "  finished_at, last_error)"
                " SELECT CASE WHEN i %% 10 = 0 THEN 'mail' ELSE 'reports' END,"
                "  jsonb_build_object('customer', 'c' || (i %% 1000), 'n', i), 30,"
                "  CASE WHEN i %% 100 < 2 THEN 'failed' WHEN i %% 100 = 2 THEN 'cancelled'"
                "       ELSE 'done' END,"
                "  t, 20, 1, 1, t - interval '3 seconds', t,"
                "  CASE WHEN i %% 100 < 2 THEN 'RuntimeError: upstream ' || (i %% 7) END"
                " FROM generate_series(%(first)s, %(last)s) AS i,"
                "  LATERAL (SELECT now() - (%(total)s - i) * interval '170 milliseconds') AS x(t)",
                {
                    "first": batch * FINISHED // 10 + 1,
                    "last": (batch + 1) * FINISHED // 10,
                    "total": FINISHED,
                },
            )
        conn.execute("SELECT pg_stat_force_next_flush()")
        _vacuum_until_all_visible(conn, queue.schema)


def _vacuum_until_all_visible(conn: Any, schema: str) -> None:
    """VACUUM ANALYZE until the visibility map covers the table, as autovacuum keeps
    an operated table: a transaction of another test process that began before the
    inserts keeps VACUUM from marking their pages all-visible, and index-only scans
    would visit the heap. Such transactions are short (those that hold a snapshot on
    purpose run in this test's xdist group, never beside it)."""
    deadline = time.monotonic() + 120
    while True:
        conn.execute(f'VACUUM ANALYZE "{schema}".job')
        row = conn.execute(
            "SELECT relallvisible, relpages FROM pg_class WHERE oid = %s::regclass",
            (f'"{schema}".job',),
        ).fetchone()
        if row[0] >= 0.99 * row[1] or time.monotonic() > deadline:
            assert row[0] >= 0.99 * row[1], f"VACUUM could not mark the table visible: {row}"
            return
        time.sleep(0.5)


class Recorder:
    """The operations a dashboard's client runs, recorded as they are sent."""

    def __init__(self) -> None:
        self.operations: list[Operation[Any]] = []

    @contextmanager
    def recording(self, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
        original = _db.AsyncDatabase.run

        async def run(db: _db.AsyncDatabase, operation: Operation[Any], *args: Any) -> Any:
            self.operations.append(operation)
            return await original(db, operation, *args)

        monkeypatch.setattr(_db.AsyncDatabase, "run", run)
        try:
            yield
        finally:
            monkeypatch.undo()


def _pages(queue: leaseq.Queue, operations: list[Operation[Any]]) -> int:
    """Pages of the schema's own tables and indexes read by the operations'
    statements, run again under EXPLAIN (ANALYZE, BUFFERS) in a transaction rolled
    back; the second, warm, run is counted. Catalog pages (health reads the
    catalogs) vary with the other schemas of the database, not with the job table."""
    total = 0
    with queue.connection() as conn, conn.transaction(force_rollback=True):
        indexes = {
            name
            for (name,) in conn.execute(
                "SELECT indexname FROM pg_indexes WHERE schemaname = %s", (queue.schema,)
            ).fetchall()
        }
        for operation in operations:
            for statement in operation.statements:
                if _is_setting(statement.sql):  # a search's plan settings: run, not explained
                    conn.execute(statement.sql)
                    continue
                sql = f"EXPLAIN (ANALYZE, BUFFERS, VERBOSE, FORMAT JSON) {statement.sql}"
                for _ in range(2):
                    row = conn.execute(sql, statement.params or None).fetchone()
                assert row is not None
                total += _own_pages(row[0][0]["Plan"], queue.schema, indexes)
    return total


def _is_setting(sql: str) -> bool:
    code = [line for line in sql.splitlines() if line.strip() and not line.startswith("--")]
    return bool(code) and code[0].startswith("SET ")


def _blocks(node: dict[str, Any]) -> int:
    return int(node["Shared Hit Blocks"] + node["Shared Read Blocks"])


def _own_pages(node: dict[str, Any], schema: str, indexes: set[str]) -> int:
    """A plan node's counts include its children's: each node's own share is its
    count minus theirs, summed over the nodes that read the schema's relations."""
    children = node.get("Plans", [])
    own = max(_blocks(node) - sum(_blocks(child) for child in children), 0)
    ours = node.get("Schema") == schema or (
        "Relation Name" not in node and node.get("Index Name") in indexes
    )
    return (own if ours else 0) + sum(_own_pages(child, schema, indexes) for child in children)


@pytest.fixture(scope="module")
def big_schema(database_url: str) -> Iterator[str]:
    name = "leaseq_web_budget"
    with leaseq.Queue(database_url, schema=name) as queue:
        with queue.connection() as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')
        queue.migrate()
        _fill(queue)
    yield name
    with leaseq.Queue(database_url, schema=name) as queue, queue.connection() as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')


@pytest.mark.slow
@pytest.mark.xdist_group("cleanup_horizon")  # reads plans after VACUUM (see test_plans)
def test_every_page_stays_under_a_buffer_budget_over_a_million_finished_rows(
    database_url: str, big_schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with leaseq.Queue(database_url, schema=big_schema) as queue:
        with queue.connection() as conn:
            row = conn.execute(
                "SELECT pg_relation_size(%s::regclass) / 8192", (f'"{big_schema}".job',)
            ).fetchone()
        assert row is not None
        table_pages = int(row[0])
        assert table_pages > 10 * PAGE_BUDGET
        failed_job = queue.find_jobs(status="failed", queue="mail", limit=1).jobs[0].job_id
        running_job = queue.list_jobs("running", limit=1)[0].job_id
        # Behind user:1's failed head: its page names the failed job holding it.
        (blocked_job,) = queue.list_jobs("queued", queue="mail", limit=1)
        assert queue.get(blocked_job.job_id).blocked_by is not None
        pages = [
            "/",
            "/live/overview",
            "/jobs",
            "/jobs?payload=customer:nobody",
            "/jobs?state=failed&error=upstream+3",
            "/jobs?queue=mail&key=user:1",
            f"/jobs/{failed_job}",
            f"/jobs/{running_job}",
            f"/jobs/{blocked_job.job_id}",
            "/failed",
            "/blocked",
            "/running",
            "/live/running",
            "/audit",
            "/queues/reports",
        ]
        measured: dict[str, int] = {}
        for path in pages:
            recorder = Recorder()
            app = create_app(database_url, schema=big_schema, cache_seconds=0)
            with recorder.recording(monkeypatch):
                status = asyncio.run(_get(app, path))
            assert status == 200, path
            assert recorder.operations, path
            measured[path] = _pages(queue, recorder.operations)
    over = {path: n for path, n in measured.items() if n > PAGE_BUDGET}
    assert not over, f"pages over the budget of {PAGE_BUDGET} (table: {table_pages}): {measured}"


async def _get(app: Any, path: str) -> int:
    transport = httpx.ASGITransport(app=app)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client,
    ):
        response = await client.get(path)
        return response.status_code


@pytest.mark.xdist_group("cleanup_horizon")  # reads plans after VACUUM (see test_plans)
@pytest.mark.parametrize("path", ["/jobs", "/failed", "/blocked", "/running"])
def test_the_pages_listing_queues_do_not_count_the_backlog(
    database_url: str, schema: str, path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """These pages list the queues for their filter: they counted every queued job
    for it (stats()), 1.3 s a page with a million queued. Their cost must not grow
    with the backlog."""

    def measured(queue: leaseq.Queue) -> int:
        recorder = Recorder()
        app = create_app(database_url, schema=schema, cache_seconds=0)
        with recorder.recording(monkeypatch):
            assert asyncio.run(_get(app, path)) == 200
        return _pages(queue, recorder.operations)

    with leaseq.Queue(database_url, schema=schema) as queue:
        queue.migrate()
        queue.enqueue_many("reports", [{"n": n} for n in range(10)])
        with queue.connection() as conn:
            conn.execute(f'VACUUM ANALYZE "{schema}".job')
        small = measured(queue)
        with queue.connection() as conn:
            conn.execute(
                f'INSERT INTO "{schema}".job (queue, payload, payload_bytes, available_at,'
                "  max_attempts)"
                " SELECT 'reports', jsonb_build_object('n', i), 10, now(), 20"
                " FROM generate_series(1, 100000) AS i"
            )
            conn.execute(f'VACUUM ANALYZE "{schema}".job')
        big = measured(queue)
    # 100,000 queued rows fill ~1,000 pages; a page that read them would show it.
    assert big < small + 100, (small, big)
