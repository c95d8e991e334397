"""A job's own timeout (``enqueue(timeout=...)``) overrides its task's."""

from __future__ import annotations

import asyncio
import contextlib
import time

import pytest

import leaseq
from leaseq import JobStatus

from .test_worker import Running, _all_finished, _until

pytestmark = pytest.mark.asyncio


@pytest.mark.parametrize("kind", ["async", "sync"])
async def test_a_jobs_own_timeout_overrides_its_tasks(
    aqueue: leaseq.AsyncQueue, database_url: str, schema: str, kind: str
) -> None:
    """The task allows 0.1 s; one job may take 5 s and finishes in 0.4 s, another
    allows itself 0.2 s of a task that has no timeout and is stopped."""
    app = leaseq.App(schema=schema)
    if kind == "async":

        @app.task("short", timeout=0.1, max_attempts=1)
        async def short(job: leaseq.JobContext) -> None:
            await asyncio.sleep(0.4)

        @app.task("unbounded", max_attempts=1)
        async def unbounded(job: leaseq.JobContext) -> None:
            await asyncio.sleep(30)

    else:

        @app.task("short", timeout=0.1, max_attempts=1)
        def short_sync(job: leaseq.JobContext) -> None:
            time.sleep(0.4)

        @app.task("unbounded", max_attempts=1)
        def unbounded_sync(job: leaseq.JobContext) -> None:
            job.lost.wait(30)  # a sync handler is told through job.lost

    generous = await aqueue.enqueue("short", {}, timeout=5)
    default = await aqueue.enqueue("short", {})
    bounded = await aqueue.enqueue("unbounded", {}, timeout=0.2)
    running = Running(leaseq.Worker(app, dsn=database_url, poll_interval=0.1, maintenance=False))
    started = time.monotonic()
    try:
        await _until(lambda: _all_finished(aqueue, "short"))
        await _until(lambda: _all_finished(aqueue, "unbounded"))
    finally:
        await running.stop()
    assert time.monotonic() - started < 25  # the 30 s handler did not run its course
    assert (await aqueue.get(generous)).status is JobStatus.DONE
    assert ((await aqueue.get(generous)).timeout, (await aqueue.get(default)).timeout) == (5, None)
    for job_id, limit in ((default, "0.1s"), (bounded, "0.2s")):
        job = await aqueue.get(job_id)
        assert job.status is JobStatus.FAILED
        assert job.last_error == f"timed out after {limit}"


@pytest.mark.parametrize("value", [0, -1, float("inf"), "5", 8 * 86400])
async def test_a_bad_timeout_is_refused_and_writes_nothing(
    aqueue: leaseq.AsyncQueue, value: object
) -> None:
    with pytest.raises(leaseq.InvalidJob, match="timeout"):
        await aqueue.enqueue("short", {}, timeout=value)  # type: ignore[arg-type]
    with pytest.raises(leaseq.InvalidJob, match="timeout"):
        await aqueue.enqueue_many("short", [{}], timeout=value)  # type: ignore[arg-type]
    assert await aqueue.stats("short") == []


async def test_a_handler_that_swallows_its_timeout_still_timed_out(
    aqueue: leaseq.AsyncQueue, database_url: str, schema: str
) -> None:
    """It catches the cancellation its timeout sends and returns a value: that is
    no success (the README: a timeout counts as a transient error). As for a sync
    handler, what a timed-out handler ends with is not its outcome."""
    app = leaseq.App(schema=schema)

    @app.task("swallowing", timeout=0.2, max_attempts=1)
    async def swallowing(job: leaseq.JobContext) -> str:
        try:
            await asyncio.sleep(5)
        except asyncio.CancelledError:
            return "finished anyway"
        return "slept"

    job_id = await aqueue.enqueue("swallowing", {})
    worker = leaseq.Worker(app, dsn=database_url, poll_interval=0.1, maintenance=False)
    running = Running(worker)
    try:
        await _until(lambda: _all_finished(aqueue, "swallowing"))
    finally:
        await running.stop()
    job = await aqueue.get(job_id)
    assert job.status is JobStatus.FAILED
    assert job.last_error == "timed out after 0.2s"
    assert worker.stats.timeouts == 1


async def test_a_handler_that_blocks_the_loop_past_its_timeout_still_timed_out(
    aqueue: leaseq.AsyncQueue, database_url: str, schema: str
) -> None:
    """It blocks the event loop (a ``time.sleep``, a blocking client) past its
    timeout, then returns: the loop never got to cancel it, but it ran out of its
    time all the same. As for a sync handler that returns after its timeout, what
    it ends with is not its outcome: a timeout (the README: a transient error)."""
    app = leaseq.App(schema=schema)

    @app.task("blocking", timeout=0.2, max_attempts=1)
    async def blocking(job: leaseq.JobContext) -> str:
        time.sleep(1.0)  # never yields: no cancellation can reach it
        return "finished anyway"

    job_id = await aqueue.enqueue("blocking", {})
    worker = leaseq.Worker(app, dsn=database_url, poll_interval=0.1, maintenance=False)
    running = Running(worker)
    try:
        await _until(lambda: _all_finished(aqueue, "blocking"))
    finally:
        await running.stop()
    job = await aqueue.get(job_id)
    assert job.status is JobStatus.FAILED
    assert job.last_error == "timed out after 0.2s"
    assert worker.stats.timeouts == 1


@pytest.mark.parametrize("how", ["converts its cancellation", "blocks the loop, then raises"])
async def test_an_error_an_async_handler_ends_with_past_its_timeout_is_a_timeout(
    aqueue: leaseq.AsyncQueue, database_url: str, schema: str, how: str
) -> None:
    """Past its timeout, what an async handler ends with is not its outcome, a
    raise no more than a return (as for a sync handler's thread): it timed out,
    a transient error. Taken as its own error, one its task fails on (here
    ``fail_on=ValueError``) failed the job for good on its first attempt."""
    app = leaseq.App(schema=schema)

    @app.task("late", timeout=0.2, max_attempts=2, backoff=(600, 600), fail_on=ValueError)
    async def late(job: leaseq.JobContext) -> None:
        if how == "converts its cancellation":
            try:
                await asyncio.sleep(5)
            except asyncio.CancelledError:
                raise ValueError("interrupted") from None
        time.sleep(0.5)  # never yields: no cancellation can reach it
        raise ValueError("late")

    job_id = await aqueue.enqueue("late", {})
    worker = leaseq.Worker(app, dsn=database_url, poll_interval=0.1, maintenance=False)
    running = Running(worker)
    try:
        await _until(lambda: _attempt_ended(aqueue, job_id))
    finally:
        await running.stop()
    job = await aqueue.get(job_id)
    assert job.status is JobStatus.QUEUED  # retried (its backoff: not due yet)
    assert job.last_error == "timed out after 0.2s"
    assert worker.stats.timeouts == 1


async def _attempt_ended(aqueue: leaseq.AsyncQueue, job_id: int) -> bool:
    job = await aqueue.get(job_id)
    if job.status is JobStatus.DONE:
        return True
    return job.status is not JobStatus.RUNNING and job.last_error is not None


async def test_an_async_handler_that_swallows_its_timeout_is_told_and_cannot_complete(
    aqueue: leaseq.AsyncQueue, database_url: str, schema: str
) -> None:
    """Past its timeout an attempt must stop: ``job.lost`` says so, and its
    job.atransaction() refuses (as a sync handler's does). An async handler
    that swallowed the cancellation saw ``job.lost`` unset and completed its
    job after its time was up: a timed-out attempt recorded as done."""
    app = leaseq.App(schema=schema)
    told: list[bool] = []

    @app.task("deaf", timeout=0.2, max_attempts=1)
    async def deaf(job: leaseq.JobContext) -> None:
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.sleep(5)
        told.append(job.lost.is_set())
        async with job.atransaction():
            job.result = "completed past its timeout"

    job_id = await aqueue.enqueue("deaf", {})
    worker = leaseq.Worker(app, dsn=database_url, poll_interval=0.1, maintenance=False)
    running = Running(worker)
    try:
        await _until(lambda: _attempt_ended(aqueue, job_id))
    finally:
        await running.stop()
    job = await aqueue.get(job_id)
    assert told == [True]
    assert job.status is JobStatus.FAILED
    assert job.last_error == "timed out after 0.2s"
    assert worker.stats.timeouts == 1
