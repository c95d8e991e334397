"""The worker runtime in-process, against the real database."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any

import psycopg
import pytest

import leaseq
from leaseq import JobStatus
from leaseq._worker.context import JobContext
from leaseq._worker.registry import acknowledgement_backlog
from leaseq.testing import aset_clock_offset

pytestmark = pytest.mark.asyncio


async def _until(condition: Callable[[], Awaitable[bool]], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not await condition():
        if time.monotonic() > deadline:
            pytest.fail("condition not reached in time")
        await asyncio.sleep(0.05)


async def _all_finished(queue: leaseq.AsyncQueue, name: str) -> bool:
    stats = await queue.stats(name)
    return bool(stats) and stats[0].queued == 0 and stats[0].running == 0


class Running:
    """A worker running in the background of a test."""

    def __init__(self, worker: leaseq.Worker) -> None:
        self.worker = worker
        self.task = asyncio.create_task(worker.run())

    async def stop(self) -> None:
        self.worker.request_stop()
        await asyncio.wait_for(self.task, 30)


def _app(schema: str) -> leaseq.App:
    return leaseq.App(schema=schema)


async def test_async_and_sync_handlers_complete_jobs(
    aqueue: leaseq.AsyncQueue, database_url: str, schema: str
) -> None:
    app = _app(schema)
    seen: list[tuple[str, int]] = []

    @app.task("async-reports")
    async def async_handler(job: leaseq.JobContext) -> None:
        await asyncio.sleep(0.01)
        seen.append(("async", job.payload["n"]))

    @app.task("sync-reports")
    def sync_handler(job: leaseq.JobContext) -> None:
        assert threading.current_thread() is not threading.main_thread()
        seen.append(("sync", job.payload["n"]))

    await aqueue.enqueue_many("async-reports", [{"n": n} for n in range(20)])
    await aqueue.enqueue_many("sync-reports", [{"n": n} for n in range(20)])
    running = Running(leaseq.Worker(app, dsn=database_url, concurrency=4, poll_interval=0.2))
    await _until(lambda: _all_finished(aqueue, "async-reports"))
    await _until(lambda: _all_finished(aqueue, "sync-reports"))
    await running.stop()
    assert sorted(seen) == sorted(
        [("async", n) for n in range(20)] + [("sync", n) for n in range(20)]
    )
    assert running.worker.stats.completed == 40
    for name in ("async-reports", "sync-reports"):
        (stats,) = await aqueue.stats(name)
        assert stats.counts[JobStatus.DONE] == 20


async def test_outcomes_retry_fail_and_classification(
    aqueue: leaseq.AsyncQueue, database_url: str, schema: str
) -> None:
    app = _app(schema)
    calls: dict[str, int] = {}

    class Upstream503(Exception):
        pass

    @app.task("work", max_attempts=3, backoff=(0, 0), fail_on=(KeyError,))
    async def handler(job: leaseq.JobContext) -> None:
        kind = job.payload["kind"]
        calls[kind] = calls.get(kind, 0) + 1
        if kind == "flaky" and job.attempts < 3:
            raise Upstream503("try later")
        if kind == "asks-retry" and job.attempts == 1:
            job.retry(delay=0)
        if kind == "permanent":
            raise leaseq.PermanentError("bad input")
        if kind == "keyerror":
            raise KeyError("missing")
        if kind == "always":
            raise RuntimeError("always broken")

    kinds = ["ok", "flaky", "asks-retry", "permanent", "keyerror", "always"]
    ids = {k: await aqueue.enqueue("work", {"kind": k}) for k in kinds}
    running = Running(leaseq.Worker(app, dsn=database_url, concurrency=3, poll_interval=0.1))
    await _until(lambda: _all_finished(aqueue, "work"))
    await running.stop()
    status = {k: (await aqueue.get(i)).status for k, i in ids.items()}
    assert status == {
        "ok": JobStatus.DONE,
        "flaky": JobStatus.DONE,
        "asks-retry": JobStatus.DONE,
        "permanent": JobStatus.FAILED,
        "keyerror": JobStatus.FAILED,
        "always": JobStatus.FAILED,
    }
    assert calls == {
        "ok": 1,
        "flaky": 3,
        "asks-retry": 2,
        "permanent": 1,
        "keyerror": 1,
        "always": 3,
    }
    failed = await aqueue.get(ids["always"])
    assert failed.attempts == 3
    # (its payload's "always" is masked in it: contract 7)
    assert failed.last_error == "RuntimeError: *** broken"
    assert (await aqueue.get(ids["permanent"])).last_error == "PermanentError: bad input"


async def test_timeout_is_a_transient_error(
    aqueue: leaseq.AsyncQueue, database_url: str, schema: str
) -> None:
    app = _app(schema)

    @app.task("slow", timeout=0.2, max_attempts=2, backoff=(0, 0))
    async def handler(job: leaseq.JobContext) -> None:
        if job.attempts == 1:
            await asyncio.sleep(30)

    job_id = await aqueue.enqueue("slow", {})
    running = Running(leaseq.Worker(app, dsn=database_url, poll_interval=0.1))
    await _until(lambda: _all_finished(aqueue, "slow"))
    await running.stop()
    job = await aqueue.get(job_id)
    assert (job.status, job.attempts) == (JobStatus.DONE, 2)
    assert job.history[0]["error"] == "timed out after 0.2s"
    assert running.worker.stats.timeouts == 1


async def test_effect_and_completion_in_one_transaction(
    aqueue: leaseq.AsyncQueue, database_url: str, schema: str
) -> None:
    async with aqueue.connection() as conn:
        await conn.execute(f'CREATE TABLE "{schema}".report (key text PRIMARY KEY, n int)')
    app = _app(schema)

    @app.task("async-tx")
    async def async_handler(job: leaseq.JobContext) -> None:
        async with job.atransaction() as conn:
            await conn.execute(
                f'INSERT INTO "{schema}".report VALUES (%s, %s)',
                (job.idempotency_key, job.payload["n"]),
            )

    @app.task("sync-tx")
    def sync_handler(job: leaseq.JobContext) -> None:
        with job.transaction() as conn:
            conn.execute(
                f'INSERT INTO "{schema}".report VALUES (%s, %s)',
                (job.idempotency_key, job.payload["n"]),
            )

    await aqueue.enqueue_many("async-tx", [{"n": n} for n in range(10)])
    await aqueue.enqueue_many("sync-tx", [{"n": n} for n in range(10)])
    running = Running(leaseq.Worker(app, dsn=database_url, concurrency=4, poll_interval=0.1))
    await _until(lambda: _all_finished(aqueue, "async-tx"))
    await _until(lambda: _all_finished(aqueue, "sync-tx"))
    await running.stop()
    async with aqueue.connection() as conn:
        cursor = await conn.execute(f'SELECT count(*) FROM "{schema}".report')
        assert await cursor.fetchone() == (20,)
    assert running.worker.stats.completed == 20


async def test_cpu_bound_sync_handler_keeps_its_lease(
    aqueue: leaseq.AsyncQueue, database_url: str, schema: str
) -> None:
    """A handler that holds the GIL in pure Python for several lease periods."""
    app = _app(schema)

    @app.task("crunch", lease=1.5)
    def handler(job: leaseq.JobContext) -> None:
        deadline = time.monotonic() + 6.0  # four lease periods
        total = 0
        while time.monotonic() < deadline:
            total += sum(i * i for i in range(10_000))
        assert not job.lost.is_set()

    job_id = await aqueue.enqueue("crunch", {})
    running = Running(leaseq.Worker(app, dsn=database_url, poll_interval=0.1))
    await _until(lambda: _all_finished(aqueue, "crunch"))
    await running.stop()
    job = await aqueue.get(job_id)
    assert (job.status, job.attempts, job.lease_version) == (JobStatus.DONE, 1, 1)
    assert running.worker.stats.lost_leases == 0


async def test_a_short_lease_claimed_beside_long_ones_is_renewed_in_time(
    aqueue: leaseq.AsyncQueue, database_url: str, schema: str
) -> None:
    """The renewal and deadline loops sleep up to a second while they keep only
    long leases; a job with a much shorter lease, claimed meanwhile, must still
    get its renewals before its deadline (each period, many times over)."""
    app = _app(schema)
    long_started = asyncio.Event()
    release_long = asyncio.Event()
    lost_seen: list[bool] = []

    @app.task("long", lease=60)
    async def long_handler(job: leaseq.JobContext) -> None:
        long_started.set()
        await release_long.wait()

    @app.task("short", lease=0.6)
    async def short_handler(job: leaseq.JobContext) -> None:
        await asyncio.sleep(3.0)  # five lease periods
        lost_seen.append(job.lost.is_set())

    await aqueue.enqueue("long", {})
    running = Running(leaseq.Worker(app, dsn=database_url, poll_interval=0.1))
    await asyncio.wait_for(long_started.wait(), 20)
    await asyncio.sleep(0.3)  # both lease loops now asleep on the 60 s lease's tick
    short_id = await aqueue.enqueue("short", {})
    await _until(lambda: _all_finished(aqueue, "short"))
    release_long.set()
    await _until(lambda: _all_finished(aqueue, "long"))
    await running.stop()
    job = await aqueue.get(short_id)
    assert (job.status, job.attempts, job.lease_version) == (JobStatus.DONE, 1, 1)
    assert lost_seen == [False]
    assert running.worker.stats.lost_leases == 0


@pytest.mark.parametrize("kind", ["async", "sync"])
async def test_lost_lease_stops_the_handler_and_is_not_acknowledged(
    aqueue: leaseq.AsyncQueue, database_url: str, schema: str, kind: str
) -> None:
    """Renewal comes too late (the database clock jumped past the lease)."""
    app = _app(schema)
    started = threading.Event()
    outcome: dict[str, Any] = {}

    if kind == "async":

        @app.task("work", lease=5)
        async def async_handler(job: leaseq.JobContext) -> None:
            started.set()
            try:
                await asyncio.sleep(60)
            except asyncio.CancelledError:
                outcome["cancelled"] = True
                raise

    else:

        @app.task("work", lease=5)
        def sync_handler(job: leaseq.JobContext) -> None:
            started.set()
            outcome["told"] = job.lost.wait(30)
            try:
                with job.transaction():
                    pass
            except leaseq.LeaseLost:
                outcome["completion_refused"] = True

    # One attempt only, so nobody reclaims the job once its lease is gone.
    job_id = await aqueue.enqueue("work", {}, max_attempts=1)
    worker = leaseq.Worker(
        app, dsn=database_url, poll_interval=0.1, renew_fraction=0.3, maintenance=False
    )
    running = Running(worker)
    await asyncio.get_running_loop().run_in_executor(None, started.wait, 10)
    # Block the renewal: hold the job's row lock while the lease runs out.
    async with aqueue.connection() as blocker, blocker.transaction():
        await blocker.execute(
            f'SELECT 1 FROM "{schema}".job WHERE job_id = %s FOR UPDATE', (job_id,)
        )
        await aset_clock_offset(aqueue, 6)  # the 5 s lease is over
        await asyncio.sleep(2.0)  # the renewal skips our locked row: the lease is over anyway
    await _until(lambda: _lost(running.worker))
    await asyncio.sleep(0.3)
    await running.stop()
    if kind == "async":
        assert outcome == {"cancelled": True}
    else:
        assert outcome == {"told": True, "completion_refused": True}
    job = await aqueue.get(job_id)
    assert job.status is JobStatus.RUNNING  # not completed: recovery will take it
    assert running.worker.stats.completed == 0


async def _lost(worker: leaseq.Worker) -> bool:
    return worker.stats.lost_leases >= 1


async def test_graceful_stop_releases_unfinished_jobs(
    aqueue: leaseq.AsyncQueue, database_url: str, schema: str
) -> None:
    app = _app(schema)
    started = asyncio.Event()

    @app.task("long")
    async def handler(job: leaseq.JobContext) -> None:
        started.set()
        if job.payload["n"] == 0:
            await asyncio.sleep(0.2)  # finishes within the grace period
        else:
            await asyncio.sleep(60)

    ids = await aqueue.enqueue_many("long", [{"n": 0}, {"n": 1}])
    worker = leaseq.Worker(app, dsn=database_url, poll_interval=0.1, shutdown_grace=1.0)
    running = Running(worker)
    await asyncio.wait_for(started.wait(), 10)
    await asyncio.sleep(0.1)
    await running.stop()
    finished, released = [await aqueue.get(i) for i in ids]
    assert finished.status is JobStatus.DONE
    assert (released.status, released.attempts) == (JobStatus.QUEUED, 0)
    assert worker.stats.released == 1
    (stats,) = await aqueue.stats("long")
    assert stats.running == 0


async def test_claims_never_exceed_free_slots(
    aqueue: leaseq.AsyncQueue, database_url: str, schema: str
) -> None:
    app = _app(schema)
    active = 0
    peak = 0

    @app.task("work")
    async def handler(job: leaseq.JobContext) -> None:
        nonlocal active, peak
        active += 1
        peak = max(peak, active)
        await asyncio.sleep(0.02)
        active -= 1

    await aqueue.enqueue_many("work", [{} for _ in range(60)])
    running = Running(leaseq.Worker(app, dsn=database_url, concurrency=5, poll_interval=0.1))
    await _until(lambda: _all_finished(aqueue, "work"))
    await running.stop()
    assert peak == 5
    (stats,) = await aqueue.stats("work")
    assert stats.counts[JobStatus.DONE] == 60


async def test_worker_sessions_carry_fault_settings(
    aqueue: leaseq.AsyncQueue, database_url: str, schema: str
) -> None:
    app = _app(schema)
    seen: dict[str, str] = {}

    @app.task("probe")
    def handler(job: leaseq.JobContext) -> None:
        with job.connection() as conn:
            row = conn.execute("SHOW idle_in_transaction_session_timeout").fetchone()
            seen["idle_in_transaction_session_timeout"] = str(row[0]) if row else ""

    await aqueue.enqueue("probe", {})
    running = Running(leaseq.Worker(app, dsn=database_url, poll_interval=0.1))
    await _until(lambda: _all_finished(aqueue, "probe"))
    await running.stop()
    assert seen["idle_in_transaction_session_timeout"] == "1min"


async def test_one_maintenance_leader_reaps(
    aqueue: leaseq.AsyncQueue, database_url: str, schema: str
) -> None:
    from leaseq._maintenance import Maintenance

    job_id = await aqueue.enqueue("work", {}, max_attempts=1)
    (claim,) = await aqueue.claim("work", lease=0.5)
    keepers = [Maintenance(aqueue, interval=0.2) for _ in range(3)]
    tasks = [asyncio.create_task(k.run()) for k in keepers]
    try:
        await _until(lambda: _job_failed(aqueue, job_id))
        await asyncio.sleep(0.5)
        assert sum(k.leading for k in keepers) == 1
        assert sum(k.reaped for k in keepers) == 1
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    del claim


async def _job_failed(queue: leaseq.AsyncQueue, job_id: int) -> bool:
    return (await queue.get(job_id)).status is JobStatus.FAILED


async def test_a_crashed_service_stops_the_worker_loudly(
    aqueue: leaseq.AsyncQueue, database_url: str, schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from leaseq._worker.leases import LeaseKeeper

    app = _app(schema)

    @app.task("work")
    async def handler(job: leaseq.JobContext) -> None:
        return None

    worker = leaseq.Worker(app, dsn=database_url, poll_interval=0.1)

    async def broken_heartbeat(self: LeaseKeeper) -> None:
        raise ValueError("boom")

    monkeypatch.setattr(LeaseKeeper, "renew_forever", broken_heartbeat)
    with pytest.raises(RuntimeError, match="a worker service crashed") as crashed:
        await asyncio.wait_for(worker.run(), 20)
    assert isinstance(crashed.value.__cause__, ValueError)


async def test_an_error_after_the_completing_transaction_changes_nothing(
    aqueue: leaseq.AsyncQueue, database_url: str, schema: str
) -> None:
    app = _app(schema)

    @app.task("work")
    async def handler(job: leaseq.JobContext) -> None:
        async with job.atransaction():
            pass
        raise RuntimeError("cleanup failed after the commit")

    job_id = await aqueue.enqueue("work", {})
    running = Running(leaseq.Worker(app, dsn=database_url, poll_interval=0.1))
    await _until(lambda: _all_finished(aqueue, "work"))
    await running.stop()
    job = await aqueue.get(job_id)
    assert (job.status, job.attempts) == (JobStatus.DONE, 1)
    assert running.worker.stats.lost_leases == 0
    assert running.worker.stats.completed == 1


async def test_a_stalled_acknowledgement_holds_a_bounded_number_of_claims(
    aqueue: leaseq.AsyncQueue, database_url: str, schema: str
) -> None:
    """A returned handler frees its slot before its acknowledgement commits, but a
    database that does not take acknowledgements never makes the worker hold more
    than concurrency + acknowledgement_backlog(concurrency) claims (here: 1 running
    or returned, 8 more awaiting their acknowledgement)."""
    app = _app(schema)
    ran: list[int] = []
    held_at_most = 1 + acknowledgement_backlog(1)
    async with await psycopg.AsyncConnection.connect(database_url) as blocker:

        @app.task("work")
        async def handler(job: leaseq.JobContext) -> None:
            # The test's open transaction locks the job's row: its completion waits.
            await blocker.execute(
                f'SELECT job_id FROM "{schema}".job WHERE job_id = %s FOR UPDATE', (job.job_id,)
            )
            ran.append(job.job_id)

        ids = await aqueue.enqueue_many("work", [{} for _ in range(held_at_most + 3)])
        running = Running(leaseq.Worker(app, dsn=database_url, concurrency=1, poll_interval=0.05))
        await _until(lambda: asyncio.sleep(0, len(ran) >= held_at_most))
        await asyncio.sleep(1.0)  # time enough to claim more, if it would
        (stats,) = await aqueue.stats("work")
        assert len(ran) == held_at_most
        assert stats.running == held_at_most
        await blocker.rollback()
        await blocker.set_autocommit(True)  # later handlers lock nothing that stays
        await _until(lambda: _all_finished(aqueue, "work"))
        await running.stop()
    assert sorted(ran) == sorted(ids)


@pytest.mark.parametrize("looked_first", [True, False])
async def test_job_lost_is_set_whether_the_handler_looked_before_or_after(
    queue: leaseq.Queue, aqueue: leaseq.AsyncQueue, looked_first: bool
) -> None:
    """``job.lost`` is made on first use: a mark that came before must show in it,
    one that comes after must set it, and a lost job's transaction is refused."""
    queue.enqueue("reports", {})
    (claim,) = queue.claim("reports")
    job = JobContext(claim, queue, aqueue)
    if looked_first:
        event = job.lost
        assert not event.is_set()
    job.mark_lost("timed out")
    job.mark_lost("worker shutting down")  # the first reason stands
    assert job.lost.is_set()
    assert job.lost.wait(0)
    assert job.lost_reason == "timed out"
    if looked_first:
        assert job.lost is event
    with pytest.raises(leaseq.LeaseLost), job.transaction():
        pass


async def test_job_lost_made_by_racing_threads_is_one_event(
    queue: leaseq.Queue, aqueue: leaseq.AsyncQueue
) -> None:
    queue.enqueue("reports", {})
    (claim,) = queue.claim("reports")
    for _ in range(50):
        job = JobContext(claim, queue, aqueue)
        seen: list[threading.Event] = []
        barrier = threading.Barrier(4)

        def look(
            job: JobContext = job,
            seen: list[threading.Event] = seen,
            barrier: threading.Barrier = barrier,
        ) -> None:
            barrier.wait()
            seen.append(job.lost)

        threads = [threading.Thread(target=look) for _ in range(4)]
        for thread in threads:
            thread.start()
        marker = threading.Thread(target=job.mark_lost, args=("lost",))
        marker.start()
        for thread in [*threads, marker]:
            thread.join()
        assert len({id(event) for event in seen}) == 1
        assert seen[0].is_set()
