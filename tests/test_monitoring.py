"""Monitoring reads: what a claim says about itself, and stats whose cost does not
grow with the finished rows (estimates past a small table, and saying so)."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from click.testing import CliRunner

import leaseq
from leaseq import JobStatus
from leaseq._cli import cli

from .clients import Client
from .conftest import Clock

FINISHED = (JobStatus.DONE, JobStatus.FAILED, JobStatus.CANCELLED)


def test_a_claim_says_how_long_its_job_waited_and_whether_it_recovered_a_lease(
    client: Client, clock: Clock
) -> None:
    client.enqueue("reports", {"n": 1})
    clock.advance(40)
    (first,) = client.claim("reports", lease=10)
    assert first.recovered is False
    assert first.wait_seconds is not None
    assert 40 <= first.wait_seconds < 100
    assert first.claimed_at is not None
    assert first.claimed_at == first.lease_until - _seconds(10)
    clock.advance(25)  # the lease ended 15 s ago
    (again,) = client.claim("reports", lease=10)
    assert again.recovered is True
    assert again.wait_seconds is not None
    assert 15 <= again.wait_seconds < 40  # since the lease expired, not since enqueue


def test_small_tables_count_every_status_exactly(client: Client) -> None:
    ids = client.enqueue_many("reports", [{"n": n} for n in range(6)])
    claims = client.claim("reports", limit=4)
    client.complete(claims[0])
    client.complete(claims[1])
    client.fail(claims[2], "broken")
    client.cancel(ids[5])
    (stats,) = client.stats("reports")
    assert stats.counts == {
        JobStatus.QUEUED: 1,
        JobStatus.RUNNING: 1,
        JobStatus.DONE: 2,
        JobStatus.FAILED: 1,
        JobStatus.CANCELLED: 1,
    }
    assert stats.estimated == frozenset()


def test_keyed_waiting_jobs_are_queued_but_not_ready(client: Client, clock: Clock) -> None:
    client.enqueue_many("reports", [{"n": n} for n in range(3)], key="acme", seqs=[1, 2, 3])
    clock.advance(30)
    (head,) = client.claim("reports", limit=5)
    clock.advance(5)
    (stats,) = client.stats("reports")
    assert (stats.queued, stats.running) == (2, 1)
    assert stats.queued_bytes == 2 * len('{"n":0}')
    assert stats.oldest_ready_age is None  # both wait behind the running head
    client.complete(head)
    (stats,) = client.stats("reports")
    assert stats.oldest_ready_age is not None
    assert stats.oldest_ready_age >= 35


# -- the cost of stats over a million finished rows (sync only: one shared SQL) --


def _nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", []):
        yield from _nodes(child)


def _job_pages(plan: dict[str, Any]) -> int:
    """Pages of the job table and its indexes the statement read (catalog pages
    vary with the other schemas of the database, not with this table)."""
    if plan.get("Relation Name") == "job":
        return int(plan["Shared Hit Blocks"] + plan["Shared Read Blocks"])
    return sum(_job_pages(child) for child in plan.get("Plans", []))


def _stats_pages(queue: leaseq.Queue, *, same_plan: bool, **overrides: Any) -> int:
    """Pages of the job table and its indexes read by the stats statement the store
    builds, run twice (the second, warm, is measured). ``same_plan``: index scans, the
    plan a large table gets (a table of a few rows would get sequential scans), and
    no index-only scans, whose heap visits depend on what vacuum could mark visible
    while other tests' transactions run."""
    (statement,) = queue._store.stats().statements
    params = {**statement.params, **overrides}
    with queue.connection() as conn, conn.transaction(force_rollback=True):
        if same_plan:
            conn.execute("SET LOCAL enable_seqscan = off")
            conn.execute("SET LOCAL enable_indexonlyscan = off")
        for _ in range(2):
            row = conn.execute(
                f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {statement.sql}", params
            ).fetchone()
    assert row is not None
    return _job_pages(row[0][0]["Plan"])


def _insert_finished(queue: leaseq.Queue, sql_select: str, *, batches: int = 1) -> None:
    """INSERT ... ``sql_select`` (``%(batch)s`` numbers the batch), then VACUUM ANALYZE.

    In batches, each its own short transaction: one transaction of several seconds
    would keep the vacuums of the tests running beside this one from removing their
    dead tuples (and make their plans read them)."""
    with queue.connection() as conn:
        for batch in range(batches):
            conn.execute(
                f'INSERT INTO "{queue.schema}".job (queue, payload, payload_bytes, status,'
                "  available_at, max_attempts, attempts, lease_version, finished_at) " + sql_select,
                {"batch": batch},
            )
        # This session's insert counts reach the statistics system now, not after
        # VACUUM has set the table's live rows (they would be added on top of it).
        conn.execute("SELECT pg_stat_force_next_flush()")
        conn.execute(f'VACUUM ANALYZE "{queue.schema}".job')


def _sampling_error(rows: int, share: float, sample: int) -> float:
    """The standard error, in rows, of a share of ``rows`` estimated from a uniform
    sample of ``sample`` rows (what ANALYZE keeps in pg_stats)."""
    return rows * math.sqrt(share * (1 - share) / sample)


@pytest.mark.xdist_group("cleanup_horizon")  # reads plans after VACUUM (see test_plans)
def test_stats_cost_the_same_with_1_and_1_000_000_finished_rows(queue: leaseq.Queue) -> None:
    """891,000 done + 9,000 cancelled jobs of one queue, 99,000 + 1,000 of another:
    the stats statement reads the same pages of the job table as with one finished
    row, counts the unfinished exactly and estimates the finished, saying so."""
    # Rows written once (no claim, no completion): no dead tuple, which vacuum might not
    # be allowed to remove while other tests' transactions run, adds a page to either side.
    queue.enqueue_many("reports", [{"n": n} for n in range(3)])
    queue.enqueue("other", {"n": 1})
    with queue.connection() as conn:
        conn.execute(
            f'INSERT INTO "{queue.schema}".job (queue, payload, payload_bytes, status,'
            "  available_at, max_attempts, attempts, lease_version, lease_until, lease_seconds)"
            " SELECT 'reports', '{}', 2, 'running', now(), 20, 1, 1,"
            "  now() + interval '1 hour', 3600 FROM generate_series(1, 2)"
        )
    _insert_finished(
        queue, "SELECT 'other', '{}', 2, 'done', now(), 20, 1, 1, now() WHERE %(batch)s = 0"
    )
    # Both measured on the path of a large table (finished counts estimated).
    one_row = _stats_pages(queue, same_plan=True, exact_pages=0)
    _insert_finished(
        queue,
        "SELECT CASE WHEN i %% 10 = 0 THEN 'other' ELSE 'reports' END, '{}', 2,"
        "  CASE WHEN i / 10 %% 100 = 0 THEN 'cancelled' ELSE 'done' END, now(), 20, 1, 1, now()"
        " FROM generate_series(%(batch)s * 100000 + 1, %(batch)s * 100000 + 100000) AS i",
        batches=10,
    )
    million = _stats_pages(queue, same_plan=True, exact_pages=0)
    assert million == one_row < 30
    # The statement left to itself at 1M rows takes that path (estimates, below), with a
    # plan of its own whose index-only scans may visit a page vacuum could not mark
    # all-visible yet: a handful of pages still, never the table's thousands.
    assert _stats_pages(queue, same_plan=False) < 30

    reports, other = sorted(queue.stats(), key=lambda s: s.queue != "reports")
    for stats in (reports, other):
        assert stats.estimated == {JobStatus.DONE, JobStatus.CANCELLED}
    assert (reports.queued, reports.running, reports.failed) == (3, 2, 0)
    assert (other.queued, other.running, other.failed) == (1, 0, 0)
    # A queue's share of rows, and done's share of the finished, come from ANALYZE's
    # sample of 300 x default_statistics_target rows: an estimate is as close as that
    # sample allows: within five of its standard errors. (A fixed 5 % was 3.3 of them for
    # the queue holding a tenth of the rows, so about one run in a thousand failed.)
    with queue.connection() as conn:
        row = conn.execute("SHOW default_statistics_target").fetchone()
    assert row is not None
    sample = 300 * int(row[0])
    rows = 900_005 + 100_002
    for stats, done, cancelled in ((reports, 891_000, 9_000), (other, 99_001, 1_000)):
        queue_rows = done + cancelled + stats.queued + stats.running
        error = _sampling_error(rows, queue_rows / rows, sample) + _sampling_error(
            done + cancelled, 990_001 / 1_000_001, sample
        )
        assert abs(stats.counts[JobStatus.DONE] - done) < 5 * error, (stats, error)
        assert abs(stats.counts[JobStatus.CANCELLED] - cancelled) < cancelled * 0.5 + 500, stats

    # Failed jobs are counted exactly (through their index) up to 10,000 per queue.
    _insert_finished(
        queue,
        "SELECT 'reports', '{}', 2, 'failed', now(), 20, 20, 20, now()"
        " FROM generate_series(1, 4321) AS i",
    )
    (reports,) = queue.stats("reports")
    assert reports.failed == 4321
    assert reports.estimated == {JobStatus.DONE, JobStatus.CANCELLED}

    # leaseq status says which numbers are estimates.
    where = ["--database-url", queue.dsn, "--schema", queue.schema]
    shown = CliRunner().invoke(cli, ["status", "--json", *where], catch_exceptions=False)
    assert shown.exit_code == 0, shown.output
    rows = {row["queue"]: row for row in json.loads(shown.output)}
    assert rows["reports"]["estimated"] == ["cancelled", "done"]
    assert (rows["reports"]["queued"], rows["reports"]["failed"]) == (3, 4321)
    table = CliRunner().invoke(cli, ["status", *where], catch_exceptions=False).output
    assert "~" in table
    assert "estimate" in table

    # Past 10,000 failed jobs a queue's failed count is an estimate too (and says so).
    _insert_finished(
        queue,
        "SELECT 'reports', '{}', 2, 'failed', now(), 20, 20, 20, now()"
        " FROM generate_series(1, 6000) AS i",
    )
    (reports,) = queue.stats("reports")
    assert reports.estimated == {JobStatus.DONE, JobStatus.FAILED, JobStatus.CANCELLED}
    assert 10_000 < reports.failed < 10_321 * 1.5, reports


def test_before_any_analyze_no_queue_is_given_finished_jobs_it_never_had(
    queue: leaseq.Queue, connect: Any
) -> None:
    """A large job table never analyzed (autovacuum off, or not yet): each queue's
    share of the rows is unknown. An equal split gave a queue with one job, and a
    configured queue with none, a third of 150,000 queued rows each, as "done"."""
    with connect(autocommit=True) as conn:  # no autoanalyze during the test
        conn.execute(f'ALTER TABLE "{queue.schema}".job SET (autovacuum_enabled = false)')
    for start in range(0, 150_000, 10_000):
        queue.enqueue_many(
            "bulk", [{"n": n, "pad": "x" * 40} for n in range(start, start + 10_000)]
        )
    queue.enqueue("emails", {})
    queue.configure_queue("audit-export", lease=30)
    with connect(autocommit=True) as conn:
        analyzed = conn.execute(
            "SELECT count(*) FROM pg_stats WHERE schemaname = %s AND tablename = 'job'",
            (queue.schema,),
        ).fetchone()
    assert analyzed == (0,)
    stats = {s.queue: s for s in queue.stats()}
    assert stats["bulk"].estimated == {JobStatus.DONE, JobStatus.CANCELLED}  # a large table
    assert stats["bulk"].queued == 150_000
    assert stats["emails"].queued == 1
    for name in ("bulk", "emails", "audit-export"):
        assert stats[name].counts[JobStatus.DONE] == 0, stats[name]
        assert stats[name].counts[JobStatus.CANCELLED] == 0, stats[name]


def _seconds(n: float) -> timedelta:
    return timedelta(seconds=n)
