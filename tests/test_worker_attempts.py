"""An attempt's outcome as its handler made it: a LeaseLost about another job is
the handler's error, a settled attempt is not lost when its job is claimed
again, an around hook entered is always exited, and no renew_fraction lets the
worker lose every long job."""

from __future__ import annotations

import asyncio
import time

import pytest

import leaseq
from leaseq import JobStatus

pytestmark = pytest.mark.asyncio


# -- a LeaseLost about another job is the handler's error, not its own lost lease --------


@pytest.mark.parametrize("kind", ["async", "sync"])
async def test_a_lease_lost_of_another_job_raised_by_a_handler_is_retried_as_its_error(
    aqueue: leaseq.AsyncQueue, queue: leaseq.Queue, database_url: str, kind: str
) -> None:
    """A handler that writes to another job with a claim of its own (a fan-in, a
    manual sub-claim) and lets that write's LeaseLost propagate: the worker took
    it for the loss of the handler's own lease. Nothing was acknowledged, no
    error was recorded, the job stayed running under a live lease that nobody
    renewed (until its expiry, a lease later), and the worker counted a lost lease."""
    schema = queue.schema
    await aqueue.enqueue("other", {})
    (stale,) = await aqueue.claim("other")
    # Given back for later: a write with this claim now raises LeaseLost.
    await aqueue.retry(stale, delay=3600)
    app = leaseq.App(schema=schema)

    if kind == "async":

        @app.task("work", backoff=(0, 0), max_attempts=3)
        async def async_handler(job: leaseq.JobContext) -> str:
            if job.attempts == 1:
                await aqueue.complete(stale)  # LeaseLost, about job `other`
            return "ok"

    else:

        @app.task("work", backoff=(0, 0), max_attempts=3)
        def sync_handler(job: leaseq.JobContext) -> str:
            if job.attempts == 1:
                queue.complete(stale)  # LeaseLost, about job `other`
            return "ok"

    job_id = await aqueue.enqueue("work", {})
    worker = leaseq.Worker(
        app, dsn=database_url, poll_interval=0.1, listen=False, maintenance=False
    )
    await asyncio.wait_for(worker.run(burst=True), 30)
    job = await aqueue.get(job_id)
    assert (job.status, job.attempts) == (JobStatus.DONE, 2), job.history
    assert "LeaseLost" in (job.history[0].get("error") or ""), job.history
    assert worker.stats.lost_leases == 0


# -- an attempt whose outcome is recorded is not lost when its job is claimed again -----


async def test_a_retried_job_claimed_again_while_its_on_failure_hook_runs_is_no_lost_lease(
    aqueue: leaseq.AsyncQueue, database_url: str, schema: str
) -> None:
    """The retry was acknowledged (counted as retried), and while the app's
    on_failure hook still ran, this worker claimed the job again (no backoff):
    the registry took the finished attempt for a stale claim and lost it. A
    lease counted as lost that nobody lost (stats.lost_leases, the
    leaseq_jobs_finished_total{outcome="lease_lost"} metric operators alert on,
    a WARNING "lease lost"), on top of its "retried"."""
    app = leaseq.App(schema=schema)
    hooked: list[bool] = []

    @app.task("work", backoff=(0, 0), max_attempts=3)
    async def handler(job: leaseq.JobContext) -> str:
        if job.attempts == 1:
            raise RuntimeError("first attempt fails")
        return "ok"

    @app.on_failure
    async def report(job: leaseq.JobContext, error: object, will_retry: bool) -> None:
        await asyncio.sleep(1.0)  # an error tracker's round trip, say
        hooked.append(will_retry)

    job_id = await aqueue.enqueue("work", {})
    worker = leaseq.Worker(
        app,
        dsn=database_url,
        concurrency=2,
        poll_interval=0.1,
        listen=False,
        maintenance=False,
        metrics=None,
    )
    await asyncio.wait_for(worker.run(burst=True), 30)
    job = await aqueue.get(job_id)
    assert (job.status, job.attempts) == (JobStatus.DONE, 2), job.history
    assert hooked == [True]
    assert (worker.stats.retried, worker.stats.completed) == (1, 1)
    assert worker.stats.lost_leases == 0


# -- an around hook entered is exited, even when a later one's entry runs out of time ---


@pytest.mark.parametrize("kind", ["async", "sync"])
async def test_an_entered_around_hook_is_exited_when_the_next_one_times_out_entering(
    aqueue: leaseq.AsyncQueue, database_url: str, schema: str, kind: str
) -> None:
    """Two async around_job hooks; the second's entry ran past the job's timeout
    (a slow span exporter, a pool's connection): the first, entered already, was
    never exited. What it holds (a lock, a connection, a span) was never given
    back, on every job that timed out there (or lost its lease, or was cut by
    a stop)."""
    app = leaseq.App(schema=schema)
    events: list[str] = []

    class First:
        """A plain class (a generator's finally would also run when collected)."""

        async def __aenter__(self) -> None:
            events.append("first entered")

        async def __aexit__(self, *details: object) -> None:
            events.append("first exited")

    class Slow:
        async def __aenter__(self) -> None:
            await asyncio.sleep(10)  # past the job's timeout

        async def __aexit__(self, *details: object) -> None:
            events.append("slow exited")

    @app.around_job
    def first(job: leaseq.JobContext) -> First:
        return First()

    @app.around_job
    def slow(job: leaseq.JobContext) -> Slow:
        return Slow()

    if kind == "async":

        @app.task("work", timeout=0.5, max_attempts=1)
        async def async_handler(job: leaseq.JobContext) -> None:
            return None

    else:

        @app.task("work", timeout=0.5, max_attempts=1)
        def sync_handler(job: leaseq.JobContext) -> None:
            return None

    job_id = await aqueue.enqueue("work", {})
    worker = leaseq.Worker(
        app, dsn=database_url, poll_interval=0.1, listen=False, maintenance=False
    )
    await asyncio.wait_for(worker.run(burst=True), 30)
    job = await aqueue.get(job_id)
    assert job.status is JobStatus.FAILED, job.history
    assert "timed out" in (job.last_error or "")
    assert events == ["first entered", "first exited"]


# -- a renew_fraction that renews after the worker's own deadline ----------------------


@pytest.mark.parametrize("fraction", [0.9, 0.5])
async def test_a_renew_fraction_past_the_local_deadline_does_not_lose_every_long_job(
    aqueue: leaseq.AsyncQueue, database_url: str, schema: str, fraction: float
) -> None:
    """Worker(renew_fraction=0.9) was accepted (anything below 1 was), but the
    worker stops trusting a lease at 80 % of it (its local deadline) when no
    renewal was confirmed: the first renewal was due after that, so every job
    running longer than 80 % of its lease was lost, cancelled and run again,
    until its attempts ran out. Refused where it is given, or kept: either way
    no lease may be lost for want of a renewal."""
    app = leaseq.App(schema=schema)

    @app.task("work", lease=2)
    async def handler(job: leaseq.JobContext) -> str:
        await asyncio.sleep(2.5)  # longer than its lease: renewals keep it
        return "ok"

    refused: leaseq.InvalidArgument | None = None
    try:
        worker = leaseq.Worker(
            app,
            dsn=database_url,
            renew_fraction=fraction,
            poll_interval=0.1,
            listen=False,
            maintenance=False,
        )
    except leaseq.InvalidArgument as exc:
        refused = exc
    if refused is not None:
        assert "renew_fraction" in str(refused)
        return
    job_id = await aqueue.enqueue("work", {})
    running = asyncio.create_task(worker.run())
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and worker.stats.completed == 0:
            await asyncio.sleep(0.1)
    finally:
        worker.request_stop()
        await asyncio.wait_for(running, 30)
    assert worker.stats.lost_leases == 0
    assert (await aqueue.get(job_id)).status is JobStatus.DONE
