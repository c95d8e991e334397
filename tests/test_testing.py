"""leaseq.testing: draining an app in the test's own process, through the worker's
own code path, and reading back what was enqueued."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import leaseq
from leaseq import JobStatus
from leaseq.testing import adrain, aenqueued, drain, enqueued, set_clock_offset

from . import clients
from .clients import Client


def _statuses(queue: leaseq.Queue, name: str) -> list[JobStatus]:
    return [job.status for job in enqueued(queue, name, status=None)]


def test_drain_runs_every_claimable_job_once_and_stores_results(
    queue: leaseq.Queue, database_url: str, schema: str
) -> None:
    app = leaseq.App(schema=schema)
    seen: list[int] = []

    @app.task("reports")
    def report(job: leaseq.JobContext) -> dict[str, int]:
        seen.append(job.payload["n"])
        return {"double": job.payload["n"] * 2}

    @app.task("emails")
    async def email(job: leaseq.JobContext) -> None:
        seen.append(100 + job.payload["n"])

    ids = queue.enqueue_many("reports", [{"n": n} for n in range(30)])
    queue.enqueue_many("emails", [{"n": n} for n in range(5)])
    later = queue.enqueue("reports", {"n": 99}, delay=3600)  # not claimable now

    stats = drain(app, dsn=database_url, concurrency=4)

    assert sorted(seen) == [*range(30), *range(100, 105)]  # each once
    assert stats.completed == 35
    assert stats.failed == stats.retried == 0
    assert [queue.result(job_id) for job_id in ids] == [{"double": 2 * n} for n in range(30)]
    assert [job.job_id for job in enqueued(queue, "reports")] == [later]  # still waiting
    assert _statuses(queue, "emails") == [JobStatus.DONE] * 5


def test_drain_takes_the_workers_retry_and_failure_path(
    queue: leaseq.Queue, database_url: str, schema: str
) -> None:
    app = leaseq.App(schema=schema)

    # Full jitter draws a delay in [0, 600] s: it never comes due within a drain.
    @app.task("flaky", max_attempts=3, backoff=(600, 600))
    def flaky(job: leaseq.JobContext) -> None:
        raise ValueError(f"attempt {job.attempts} failed")

    job_id = queue.enqueue("flaky", {})
    first = drain(app, dsn=database_url)
    assert (first.retried, first.failed) == (1, 0)
    job = queue.get(job_id)
    assert job.status is JobStatus.QUEUED  # its backoff is ahead
    assert job.attempts == 1
    assert "attempt 1 failed" in (job.last_error or "")

    for attempt in (2, 3):
        set_clock_offset(queue, 1000 * attempt)  # past the backoff
        drain(app, dsn=database_url)
        assert queue.get(job_id).attempts == attempt
    job = queue.get(job_id)
    assert job.status is JobStatus.FAILED
    assert "attempt 3 failed" in (job.last_error or "")


def test_drain_follows_keyed_order_and_jobs_enqueued_by_handlers(
    queue: leaseq.Queue, database_url: str, schema: str
) -> None:
    app = leaseq.App(schema=schema)
    order: list[tuple[str, int]] = []

    @app.task("steps")
    def step(job: leaseq.JobContext) -> None:
        order.append((job.payload["account"], job.payload["n"]))
        if job.payload["n"] == 2:  # a follow-up, enqueued while draining
            queue.enqueue("notify", {"account": job.payload["account"]})

    @app.task("notify")
    def notify(job: leaseq.JobContext) -> None:
        order.append(("notified " + job.payload["account"], 0))

    for n in range(3):
        for account in ("a", "b"):
            queue.enqueue("steps", {"account": account, "n": n}, key=account)

    stats = drain(app, dsn=database_url, concurrency=4)

    assert stats.completed == 8
    for account in ("a", "b"):
        assert [n for name, n in order if name == account] == [0, 1, 2]  # in key order
        assert order.index((f"notified {account}", 0)) > order.index((account, 2))


def test_drain_refuses_a_running_event_loop_and_reports_a_stuck_handler(
    database_url: str, schema: str, queue: leaseq.Queue
) -> None:
    app = leaseq.App(schema=schema)

    @app.task("stuck")
    async def stuck(job: leaseq.JobContext) -> None:
        await asyncio.sleep(3600)

    async def inside_a_loop() -> None:
        drain(app, dsn=database_url)

    with pytest.raises(RuntimeError, match="adrain"):
        asyncio.run(inside_a_loop())
    for bad in (-1, 0, float("nan"), "1"):  # not "jobs still ran after -1s"
        with pytest.raises(leaseq.InvalidArgument, match="timeout"):
            drain(app, dsn=database_url, timeout=bad)  # type: ignore[arg-type]
    queue.enqueue("stuck", {})
    with pytest.raises(TimeoutError, match="never returned"):
        drain(app, dsn=database_url, timeout=1.0)


@pytest.mark.asyncio
async def test_adrain_and_aenqueued(
    aqueue: leaseq.AsyncQueue, database_url: str, schema: str
) -> None:
    app = leaseq.App(schema=schema)

    @app.task("reports")
    async def report(job: leaseq.JobContext) -> int:
        return int(job.payload["n"])

    await aqueue.enqueue_many("reports", [{"n": n} for n in range(3)])
    assert [job.payload for job in await aenqueued(aqueue, "reports")] == [
        {"n": 0},
        {"n": 1},
        {"n": 2},
    ]
    stats = await adrain(app, dsn=database_url)
    assert stats.completed == 3
    assert await aenqueued(aqueue, "reports") == []
    done = await aenqueued(aqueue, "reports", status="done")
    assert [await aqueue.result(job.job_id) for job in done] == [0, 1, 2]


async def test_enqueued_lists_every_job_however_many_oldest_first(
    queue: leaseq.Queue, aqueue: leaseq.AsyncQueue
) -> None:
    """A test that enqueued more jobs than one page of ``find_jobs`` holds gets all
    of them, the oldest first: never a list that silently starts somewhere else."""
    ids = queue.enqueue_many("emails", [{"n": n} for n in range(1234)])
    queue.enqueue("other", {"n": -1})
    listed = enqueued(queue, "emails")
    assert [job.job_id for job in listed] == sorted(ids)
    assert [job.job_id for job in await aenqueued(aqueue, "emails")] == sorted(ids)
    assert len(enqueued(queue, None)) == len(ids) + 1


@pytest.mark.parametrize("offset", [5e-05, -2e-06, 1e-07, 123456.5])
def test_any_clock_offset_in_range_is_set(queue: leaseq.Queue, offset: float) -> None:
    """A tiny one too (a difference of two times may be one): Python writes it with
    an exponent, which PostgreSQL's interval input refuses."""
    set_clock_offset(queue, offset)
    with queue.connection() as conn:
        row = conn.execute(
            f'SELECT extract(epoch FROM "{queue.schema}".clock() - statement_timestamp())'
        ).fetchone()
    assert row is not None
    assert abs(float(row[0]) - offset) < 1e-6


@pytest.mark.parametrize(
    "offset",
    ["5", True, "abc", 10**400, -(10**400), float("nan"), float("inf"), 1e10, None],
    ids=["text", "True", "abc", "10**400", "-10**400", "nan", "inf", "over a century", "None"],
)
def test_a_clock_offset_is_a_finite_number_of_seconds(client: Client, offset: Any) -> None:
    """Text ("5") and True were taken, "abc" raised ValueError, 10**400 OverflowError."""
    with pytest.raises(leaseq.InvalidArgument, match="clock offset"):
        clients.set_clock_offset(client, offset)


def test_a_clock_offset_may_be_negative_or_whole(client: Client) -> None:
    clients.set_clock_offset(client, -3600)
    clients.set_clock_offset(client, 2)
    job_id = client.enqueue("reports", {}, delay=1)
    assert client.claim("reports") == []  # the offset is absolute, not cumulative
    clients.set_clock_offset(client, 3.5)
    assert [c.job_id for c in client.claim("reports")] == [job_id]


# -- leaseq.testing: a client of the other kind ---------------------------------------


async def test_the_testing_helpers_refuse_a_client_of_the_other_kind(
    queue: leaseq.Queue, aqueue: leaseq.AsyncQueue
) -> None:
    """set_clock_offset(an AsyncQueue) did nothing at all (the coroutine of the
    async client was never awaited: the test's clock silently stayed where it
    was); aset_clock_offset(a Queue) moved the clock, blocking the loop, then
    raised a TypeError; enqueued(an AsyncQueue) raised an AttributeError about a
    coroutine. leaseq refuses a connection of the other kind with InvalidArgument
    (conn=): so do its testing helpers, before anything is done."""
    from leaseq.testing import aenqueued, aset_clock_offset, enqueued, set_clock_offset

    job_id = await aqueue.enqueue("emails", {"n": 1}, delay=60)
    with pytest.raises(leaseq.InvalidArgument, match="aset_clock_offset"):
        set_clock_offset(aqueue, 120)  # type: ignore[arg-type]
    with pytest.raises(leaseq.InvalidArgument, match="set_clock_offset"):
        await aset_clock_offset(queue, 120)  # type: ignore[arg-type]
    with pytest.raises(leaseq.InvalidArgument, match="aenqueued"):
        enqueued(aqueue, "emails")  # type: ignore[arg-type]
    with pytest.raises(leaseq.InvalidArgument, match="enqueued"):
        await aenqueued(queue, "emails")  # type: ignore[arg-type]
    # The clock did not move: the delayed job is still not claimable.
    assert await aqueue.claim("emails") == []
    assert [job.job_id for job in await aenqueued(aqueue, "emails")] == [job_id]
