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


async def _synchronous_commit(client: leaseq.AsyncQueue) -> str:
    async with client.connection() as conn:
        row = await (await conn.execute("SHOW synchronous_commit")).fetchone()
    assert row is not None
    return str(row[0])


@pytest.mark.parametrize("durable", [True, False])
async def test_only_acknowledgements_may_skip_the_wal_flush_and_only_when_told(
    database_url: str, schema: str, durable: bool
) -> None:
    """A claim must be durable before its job starts: one lost in a crash would hand
    its lease_version out again. So must renewals: the worker runs on under a
    confirmed renewal, and one lost in a crash would let another worker claim the
    job meanwhile. Acknowledgements may commit without waiting for the flush, and
    only when the application opts out of durable ones."""
    from leaseq._worker.connections import WorkerClients

    async with leaseq.AsyncQueue(database_url, schema=schema) as plain:
        server_default = await _synchronous_commit(plain)
    assert server_default != "off"  # or this test could not tell anything apart
    clients = WorkerClients.open(
        database_url,
        schema,
        concurrency=2,
        listen_dsn=None,
        durable_acknowledgements=durable,
    )
    try:
        assert await _synchronous_commit(clients.claims) == server_default
        assert await _synchronous_commit(clients.renewals) == server_default
        acknowledgements = await _synchronous_commit(clients.acknowledgements)
        assert acknowledgements == (server_default if durable else "off")
    finally:
        await clients.close(30)


async def test_a_worker_without_durable_acknowledgements_finishes_every_job_once(
    aqueue: leaseq.AsyncQueue, database_url: str, schema: str
) -> None:
    app = leaseq.App(schema=schema)
    ran: list[int] = []

    @app.task("work", backoff=(0, 0))
    async def handler(job: leaseq.JobContext) -> str:
        ran.append(job.payload["n"])
        if job.payload["n"] % 10 == 0 and job.attempts == 1:
            raise RuntimeError("once")  # a retry, acknowledged the same way
        return "ok"

    ids = (await aqueue.enqueue_many("work", [{"n": n} for n in range(60)])).inserted
    worker = leaseq.Worker(
        app,
        dsn=database_url,
        concurrency=8,
        poll_interval=0.1,
        maintenance=False,
        durable_acknowledgements=False,
    )
    running = Running(worker)
    await _until(lambda: _all_finished(aqueue, "work"))
    assert await _synchronous_commit(worker._clients.acknowledgements) == "off"
    await running.stop()
    jobs = [await aqueue.get(job_id) for job_id in ids]
    assert {job.status for job in jobs} == {JobStatus.DONE}
    assert sorted(ran) == sorted(list(range(60)) + list(range(0, 60, 10)))
    assert [await aqueue.result(job_id) for job_id in ids] == ["ok"] * 60
    assert (worker.stats.completed, worker.stats.retried) == (60, 6)
