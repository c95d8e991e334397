"""A database that turns read-only under leaseq: a failover that leaves the URL on
a standby, or an operator's read-only mode for a move. Every call says so as a
DatabaseUnavailable (a TransientError: try again) and writes nothing; a worker
waits it out and loses nothing; and once the database takes writes again, the
next call works: no connection of the read-only time is kept."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from typing import TypeVar

import psycopg
import pytest

import leaseq
from leaseq import JobStatus

from .conftest import SpareDatabase

T = TypeVar("T")

#: Calls to make before the read-only refusal shows: the first may meet the
#: connection that turning the database read-only ended (a lost connection).
FIRST_CALLS = 3


def _refusal(call: Callable[[], object]) -> leaseq.TransientError:
    """The error the database's read-only time gives ``call``, past the lost
    connections of its first calls."""
    error: leaseq.TransientError | None = None
    for _ in range(FIRST_CALLS):
        try:
            call()
        except leaseq.TransientError as exc:
            error = exc
            if "read-only" in str(exc):
                return exc
        else:
            pytest.fail("a write went through on a read-only database")
    assert error is not None
    return error


def test_a_queue_on_a_read_only_database_says_so_and_writes_again_once_it_may(
    spare_database: SpareDatabase,
) -> None:
    spare_database.create()
    with leaseq.Queue(spare_database.dsn, connect_timeout=2) as queue:
        queue.migrate()
        first = queue.enqueue("reports", {"n": 0})
        spare_database.turn_read_only()
        refusal = _refusal(lambda: queue.enqueue("reports", {"n": 1}))
        assert isinstance(refusal, leaseq.DatabaseUnavailable), refusal
        assert "read-only" in str(refusal)
        for _ in range(2):  # each call while it lasts says so, typed
            with pytest.raises(leaseq.DatabaseUnavailable, match="read-only"):
                queue.enqueue("reports", {"n": 2})
        spare_database.turn_writable()
        # The first call after: not on a connection of the read-only time.
        second = queue.enqueue("reports", {"n": 3})
        jobs = queue.list_jobs(JobStatus.QUEUED, queue="reports")
        assert sorted(job.job_id for job in jobs) == [first, second]
        assert sorted(job.payload["n"] for job in jobs) == [0, 3]


async def test_an_async_queue_on_a_read_only_database_says_so_and_writes_again_once_it_may(
    spare_database: SpareDatabase,
) -> None:
    spare_database.create()
    async with leaseq.AsyncQueue(spare_database.dsn, connect_timeout=2) as queue:
        await queue.migrate()
        first = await queue.enqueue("reports", {"n": 0})
        spare_database.turn_read_only()
        refusal: leaseq.TransientError | None = None
        for _ in range(FIRST_CALLS):
            try:
                await queue.enqueue("reports", {"n": 1})
            except leaseq.TransientError as exc:
                refusal = exc
                if "read-only" in str(exc):
                    break
            else:
                pytest.fail("a write went through on a read-only database")
        assert isinstance(refusal, leaseq.DatabaseUnavailable), refusal
        assert "read-only" in str(refusal)
        with pytest.raises(leaseq.DatabaseUnavailable, match="read-only"):
            await queue.enqueue("reports", {"n": 2})
        spare_database.turn_writable()
        second = await queue.enqueue("reports", {"n": 3})
        jobs = await queue.list_jobs(JobStatus.QUEUED, queue="reports")
        assert sorted(job.job_id for job in jobs) == [first, second]


def _until_it_goes_through(call: Callable[[], T]) -> T:
    """``call``, tried again past the connections a test's database change ended."""
    for _ in range(FIRST_CALLS - 1):
        with contextlib.suppress(leaseq.TransientError):
            return call()
    return call()


async def test_a_worker_waits_out_a_read_only_database_and_loses_nothing(
    spare_database: SpareDatabase,
) -> None:
    """It used to stop on the first refused claim: a failover onto a standby
    ended every worker."""
    spare_database.create()
    with leaseq.Queue(spare_database.dsn, connect_timeout=2) as queue:
        queue.migrate()
        app = leaseq.App()
        started: list[int] = []
        finish_first = asyncio.Event()

        @app.task("work")
        async def handler(job: leaseq.JobContext) -> None:
            started.append(job.payload["n"])
            if job.payload["n"] == 0:
                await finish_first.wait()

        # Maintenance every 0.2 s: its leader's session (the reaper's writes)
        # meets the read-only time too.
        worker = leaseq.Worker(
            app, dsn=spare_database.dsn, poll_interval=0.2, maintenance_interval=0.2
        )
        running = asyncio.create_task(worker.run())
        try:
            queue.enqueue("work", {"n": 0})
            deadline = time.monotonic() + 30
            while not started and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            assert started == [0]
            spare_database.turn_read_only()
            # Its completion meets the read-only database, as do the claim
            # loop's polls, the listener's reconnections and the heartbeat.
            finish_first.set()
            await asyncio.sleep(3.0)
            assert not running.done(), running.result() if running.done() else None
            assert queue_status_now(spare_database, "work") == {"running": 1}
            spare_database.turn_writable()
            _until_it_goes_through(lambda: queue.enqueue("work", {"n": 1}))
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                stats = _until_it_goes_through(lambda: queue.stats("work"))
                if stats and stats[0].counts[JobStatus.DONE] == 2:
                    break
                await asyncio.sleep(0.1)
            else:
                pytest.fail(f"not both jobs done: {queue.stats('work')}")
        finally:
            worker.request_stop()
            await asyncio.wait_for(running, 60)
        assert started == [0, 1]  # each ran once: the first was not run again
        assert worker.stats.completed == 2
        assert worker.stats.database_errors > 0


def queue_status_now(spare_database: SpareDatabase, queue: str) -> dict[str, int]:
    """The queue's jobs by status, read on a session of its own (read-only is
    enough to read)."""
    with psycopg.connect(spare_database.dsn, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT status::text, count(*) FROM leaseq.job WHERE queue = %s GROUP BY 1",
            (queue,),
        ).fetchall()
    return {status: int(count) for status, count in rows}
