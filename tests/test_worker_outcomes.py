"""The worker counts what the database did with an acknowledgement, not what it asked for.

A retry is a request: the database fails the job instead when its attempts are
used up (``retry.sql``), and its answer says so. The worker's stats follow
that answer.
"""

from __future__ import annotations

import asyncio

import pytest

import leaseq
from leaseq import JobStatus

from .test_worker import Running, _all_finished, _until

pytestmark = pytest.mark.asyncio


async def test_an_exhausted_job_counts_one_retry_and_one_failure(
    aqueue: leaseq.AsyncQueue, database_url: str, schema: str
) -> None:
    """The task leaves max_attempts to the queue's setting (2 here)."""
    await aqueue.configure_queue("work", max_attempts=2)
    app = leaseq.App(schema=schema)

    @app.task("work", backoff=(0, 0))
    async def handler(job: leaseq.JobContext) -> None:
        raise RuntimeError("always broken")

    job_id = await aqueue.enqueue("work", {})
    running = Running(leaseq.Worker(app, dsn=database_url, poll_interval=0.1, maintenance=False))
    await _until(lambda: _all_finished(aqueue, "work"))
    await running.stop()
    job = await aqueue.get(job_id)
    assert (job.status, job.attempts) == (JobStatus.FAILED, 2)
    assert [entry["outcome"] for entry in job.history] == ["retry", "failed"]
    stats = running.worker.stats
    assert (stats.retried, stats.failed, stats.completed) == (1, 1, 0)


async def test_a_retry_the_database_turns_into_a_failure_counts_as_failed(
    aqueue: leaseq.AsyncQueue, database_url: str, schema: str
) -> None:
    """The claim said 3 attempts; the job's row says 1 by the time the retry is sent.

    The worker sends RETRY (attempt 1 of 3, as far as it knows), the database
    fails the job (attempt 1 of 1) and answers FAILED: that is a failure, not a
    retry, in the worker's stats.
    """
    app = leaseq.App(schema=schema)
    started = asyncio.Event()
    lowered = asyncio.Event()

    @app.task("work", backoff=(0, 0))
    async def handler(job: leaseq.JobContext) -> None:
        started.set()
        await lowered.wait()
        raise RuntimeError("upstream broke")

    job_id = await aqueue.enqueue("work", {}, max_attempts=3)
    running = Running(leaseq.Worker(app, dsn=database_url, poll_interval=0.1, maintenance=False))
    await asyncio.wait_for(started.wait(), 20)
    async with aqueue.connection() as conn:  # what an operator's UPDATE would do
        await conn.execute(
            f'UPDATE "{schema}".job SET max_attempts = 1 WHERE job_id = %s', (job_id,)
        )
    lowered.set()
    await _until(lambda: _all_finished(aqueue, "work"))
    await running.stop()
    job = await aqueue.get(job_id)
    assert (job.status, job.attempts) == (JobStatus.FAILED, 1)
    (entry,) = job.history
    assert (entry["write"], entry["outcome"]) == ("retry", "failed")  # sent as a retry
    stats = running.worker.stats
    assert (stats.retried, stats.failed) == (0, 1)
