"""Cancelling a running job held by a real worker: the handler is told as of a lost
lease (sooner than its next renewal, through the notification), whatever it reports
afterwards is refused, the job ends cancelled, and nothing runs it twice."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest

import leaseq
from leaseq import JobStatus, LeaseLost

from .test_worker import Running, _until

pytestmark = pytest.mark.asyncio

#: Long enough that the first renewal (at a third of it) comes well after the
#: notification should have told the handler.
LEASE = 60.0


async def _cancel_when_started(
    aqueue: leaseq.AsyncQueue, job_id: int, started: threading.Event
) -> float:
    await _until(lambda: asyncio.sleep(0, started.is_set()))
    assert (await aqueue.get(job_id)).status is JobStatus.RUNNING
    cancelled_at = time.monotonic()
    assert await aqueue.cancel(job_id, running=True, actor="test")
    return cancelled_at


async def test_a_sync_handler_is_told_and_its_late_completion_refused(
    aqueue: leaseq.AsyncQueue, database_url: str, schema: str
) -> None:
    app = leaseq.App(schema=schema)
    started = threading.Event()
    runs: list[int] = []
    seen: dict[str, Any] = {}

    @app.task("slow", lease=LEASE)
    def handler(job: leaseq.JobContext) -> None:
        runs.append(job.attempts)
        started.set()
        seen["told"] = job.lost.wait(LEASE)
        seen["told_at"] = time.monotonic()
        # A handler that ignores the signal and reports anyway is refused by the
        # database, not only by its own worker.
        with leaseq.Queue(database_url, schema=schema) as late:
            try:
                late.complete(job.claim)
                seen["completion"] = "accepted"
            except LeaseLost:
                seen["completion"] = "refused"

    job_id = await aqueue.enqueue("slow", {"report": 1})
    running = Running(leaseq.Worker(app, dsn=database_url, concurrency=2, poll_interval=0.1))
    cancelled_at = await _cancel_when_started(aqueue, job_id, started)
    await _until(lambda: asyncio.sleep(0, "completion" in seen), timeout=LEASE)
    assert seen["told"]
    # Told through the notification, before the first renewal (at LEASE / 3) would have.
    assert seen["told_at"] - cancelled_at < LEASE / 3
    assert seen["completion"] == "refused"
    await asyncio.sleep(0.5)  # a chance for anything wrong to run it again
    await running.stop()
    job = await aqueue.get(job_id)
    assert job.status is JobStatus.CANCELLED
    assert runs == [1]
    assert running.worker.stats.completed == 0
    assert running.worker.stats.lost_leases == 1


async def test_an_async_handler_is_cancelled(
    aqueue: leaseq.AsyncQueue, database_url: str, schema: str
) -> None:
    app = leaseq.App(schema=schema)
    started = threading.Event()
    runs: list[int] = []
    ended: list[str] = []

    @app.task("slow", lease=LEASE)
    async def handler(job: leaseq.JobContext) -> None:
        runs.append(job.attempts)
        started.set()
        try:
            await asyncio.sleep(LEASE * 2)
            ended.append("slept")
        except asyncio.CancelledError:
            ended.append("cancelled" if job.lost.is_set() else "cancelled without lost")
            raise

    job_id = await aqueue.enqueue("slow", {"report": 1})
    running = Running(leaseq.Worker(app, dsn=database_url, concurrency=2, poll_interval=0.1))
    cancelled_at = await _cancel_when_started(aqueue, job_id, started)
    await _until(lambda: asyncio.sleep(0, bool(ended)), timeout=LEASE)
    assert ended == ["cancelled"]
    assert time.monotonic() - cancelled_at < LEASE / 3
    await asyncio.sleep(0.5)
    await running.stop()
    assert (await aqueue.get(job_id)).status is JobStatus.CANCELLED
    assert runs == [1]
    assert running.worker.stats.completed == 0


async def test_without_notifications_the_next_renewal_tells(
    aqueue: leaseq.AsyncQueue, database_url: str, schema: str
) -> None:
    """A worker that does not listen learns at its next renewal: never later."""
    app = leaseq.App(schema=schema)
    started = threading.Event()
    ended: list[str] = []

    @app.task("slow", lease=3.0)
    async def handler(job: leaseq.JobContext) -> None:
        started.set()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            ended.append("cancelled")
            raise

    job_id = await aqueue.enqueue("slow", {})
    worker = leaseq.Worker(app, dsn=database_url, concurrency=1, poll_interval=0.1, listen=False)
    running = Running(worker)
    await _cancel_when_started(aqueue, job_id, started)
    await _until(lambda: asyncio.sleep(0, bool(ended)), timeout=10)
    await running.stop()
    assert (await aqueue.get(job_id)).status is JobStatus.CANCELLED


@pytest.mark.parametrize("listen", [True, False])
async def test_the_next_job_of_a_cancelled_jobs_key_never_starts_beside_it(
    aqueue: leaseq.AsyncQueue, database_url: str, schema: str, listen: bool
) -> None:
    """What must never happen: two handlers of one ordering key running at once.
    The cancelled handler winds down for a while once told; without notifications
    it is told only at its next renewal (a third of its lease)."""
    app = leaseq.App(schema=schema)
    started = threading.Event()
    spans: dict[int, list[float]] = {}

    @app.task("ordered", lease=3.0)
    def handler(job: leaseq.JobContext) -> None:
        spans[job.payload["n"]] = [time.monotonic()]
        if job.payload["n"] == 1:
            started.set()
            job.lost.wait(10)
            time.sleep(0.3)  # winding down, as handlers do
        spans[job.payload["n"]].append(time.monotonic())

    first = await aqueue.enqueue("ordered", {"n": 1}, key="k", seq=1)
    await aqueue.enqueue("ordered", {"n": 2}, key="k", seq=2)
    worker = leaseq.Worker(app, dsn=database_url, concurrency=2, poll_interval=0.1, listen=listen)
    running = Running(worker)
    await _cancel_when_started(aqueue, first, started)
    await _until(lambda: asyncio.sleep(0, len(spans.get(2, ())) == 2), timeout=20)
    await running.stop()
    end_1, start_2 = spans[1][1], spans[2][0]
    assert end_1 <= start_2, f"the next job started {end_1 - start_2:.3f}s before the first ended"
