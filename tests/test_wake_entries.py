"""An enqueue notifies only while a worker waits for a wake-up on its queue
(migration 0020), and no wake-up is lost for it: a job committed while a worker
waits starts about when it commits, never only at the worker's poll.

The workers here poll once a minute: a job that starts within a few seconds was
woken (or found by the entry's settling), not polled for."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager, suppress
from typing import Any

import psycopg
import pytest

import leaseq
from leaseq._worker import wake_entries

from .roles import restricted_roles

pytestmark = pytest.mark.asyncio

#: Far beyond every wait below: what starts in time was not polled for.
POLL = 60.0
#: How soon a job enqueued while a worker waits must start.
PROMPTLY = 5.0


async def _until(condition: Callable[[], Awaitable[bool]], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not await condition():
        if time.monotonic() > deadline:
            pytest.fail("condition not reached in time")
        await asyncio.sleep(0.02)


class Started:
    """Jobs' start times, by payload id."""

    def __init__(self) -> None:
        self.at: dict[int, float] = {}
        self.changed = asyncio.Event()

    async def within(self, job: int, since: float, seconds: float = PROMPTLY) -> float:
        deadline = since + seconds
        while job not in self.at:
            left = deadline - time.monotonic()
            if left <= 0:
                pytest.fail(f"job {job} did not start within {seconds} s (the poll is {POLL} s)")
            self.changed.clear()
            with suppress(TimeoutError):
                await asyncio.wait_for(self.changed.wait(), left)
        return self.at[job] - since


def _app(schema: str, started: Started, *, seconds: float = 0.0) -> leaseq.App:
    app = leaseq.App(schema=schema)

    @app.task("reports")
    async def report(job: leaseq.JobContext) -> None:
        started.at[job.payload["n"]] = time.monotonic()
        started.changed.set()
        await asyncio.sleep(seconds)

    return app


@asynccontextmanager
async def _worker(
    database_url: str, schema: str, started: Started, **options: Any
) -> AsyncIterator[leaseq.Worker]:
    options.setdefault("poll_interval", POLL)
    worker = leaseq.Worker(
        _app(schema, started, seconds=options.pop("seconds", 0.0)), dsn=database_url, **options
    )
    task = asyncio.create_task(worker.run())
    try:
        yield worker
    finally:
        worker.request_stop()
        await asyncio.wait_for(task, 30)


async def _entries(database_url: str, schema: str) -> list[tuple[str, str]]:
    """(queue, worker) of every wake-up entry (the queues' rows say who waits)."""
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
        cur = await conn.execute(
            f'SELECT q.name, w FROM "{schema}".queue AS q, jsonb_object_keys(q.waiting) AS w '
            "ORDER BY 1, 2"
        )
        return [(str(q), str(w)) for q, w in await cur.fetchall()]


async def _entered(database_url: str, schema: str, queue: str = "reports") -> None:
    async def entered() -> bool:
        return any(q == queue for q, _ in await _entries(database_url, schema))

    await _until(entered)


@asynccontextmanager
async def _listening(
    database_url: str, channel: str
) -> AsyncIterator[Callable[[], Awaitable[list[str]]]]:
    """The notifications a session LISTENing on ``channel`` gets (each call: those
    that come within half a second)."""
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
        await conn.execute(f'LISTEN "{channel}"')

        async def heard() -> list[str]:
            return [n.payload async for n in conn.notifies(timeout=0.5, stop_after=20)]

        yield heard


async def test_with_no_worker_waiting_no_enqueue_notifies(
    aqueue: leaseq.AsyncQueue, database_url: str
) -> None:
    async with _listening(database_url, aqueue._store.channel) as heard:
        await aqueue.enqueue("reports", {"n": 1})
        await aqueue.enqueue_many("reports", [{"n": 2}, {"n": 3}])
        await aqueue.enqueue("reports", {"n": 4}, unique_key="u1")
        await aqueue.enqueue_many("reports", [{"n": 5}], unique_keys=["u2"])
        assert await heard() == []


async def test_a_waiting_worker_is_woken_by_every_kind_of_enqueue(
    aqueue: leaseq.AsyncQueue, database_url: str, schema: str
) -> None:
    started = Started()
    async with (
        _listening(database_url, aqueue._store.channel) as heard,
        _worker(database_url, schema, started),
    ):
        await _entered(database_url, schema)
        await asyncio.sleep(0.3)  # its entry settled (no producer was in flight)
        enqueues = [
            lambda: aqueue.enqueue("reports", {"n": 1}),
            lambda: aqueue.enqueue_many("reports", [{"n": 2}]),
            lambda: aqueue.enqueue("reports", {"n": 3}, unique_key="u1"),
            lambda: aqueue.enqueue_many("reports", [{"n": 4}], unique_keys=["u2"]),
        ]
        for n, enqueue in enumerate(enqueues, start=1):
            since = time.monotonic()
            await enqueue()
            await started.within(n, since)
        assert set(await heard()) <= {"reports"}


async def test_a_job_committed_while_the_worker_enters_its_queue_starts_promptly(
    aqueue: leaseq.AsyncQueue, database_url: str, schema: str
) -> None:
    """The producer read "nobody waits" (no NOTIFY) before the worker's entry
    existed, and commits after the worker's claims came back empty: the worker
    must still find the job, at once, not at its poll."""
    started = Started()
    async with await psycopg.AsyncConnection.connect(database_url) as producer:
        await aqueue.enqueue("reports", {"n": 1}, conn=producer)  # open, not committed
        async with _worker(database_url, schema, started):
            await _entered(database_url, schema)
            await asyncio.sleep(1.0)  # its claims came back empty meanwhile
            assert started.at == {}
            since = time.monotonic()
            await producer.commit()
            await started.within(1, since)


async def test_a_producer_that_read_before_the_entry_and_wrote_after_it_wakes_the_worker(
    aqueue: leaseq.AsyncQueue, database_url: str, schema: str
) -> None:
    """The enqueue read "nobody waits", then took its time before its row went in
    (here a slow trigger; a busy server does the same): the worker entered
    meanwhile and its claims came back empty. The job still starts promptly."""
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
        await conn.execute(
            f'CREATE FUNCTION "{schema}".slow_insert() RETURNS trigger LANGUAGE plpgsql '
            "AS $$ BEGIN PERFORM pg_sleep(2); RETURN NEW; END $$"
        )
        await conn.execute(
            f'CREATE TRIGGER slow BEFORE INSERT ON "{schema}".job FOR EACH ROW '
            f"WHEN (NEW.payload ? 'slow') EXECUTE FUNCTION \"{schema}\".slow_insert()"
        )
    await aqueue.enqueue("reports", {"n": 0})  # the queue's row exists: no write before
    started = Started()
    enqueueing = asyncio.create_task(aqueue.enqueue("reports", {"n": 1, "slow": True}))
    await asyncio.sleep(0.2)  # it has read "nobody waits", and sleeps before its insert
    async with _worker(database_url, schema, started):
        await enqueueing
        since = time.monotonic()
        await started.within(1, since)


async def test_a_repeatable_read_producer_begun_before_the_entry_still_wakes_the_worker(
    aqueue: leaseq.AsyncQueue, database_url: str, schema: str
) -> None:
    """Its snapshot predates the entry, and it took its transaction id after the
    worker's fence: only a notification can wake the worker for its job."""
    await aqueue.enqueue("reports", {"n": 0})  # the queue's row exists before the snapshot
    started = Started()
    async with await psycopg.AsyncConnection.connect(database_url) as producer:
        await producer.set_isolation_level(psycopg.IsolationLevel.REPEATABLE_READ)
        await producer.execute("SELECT 1")  # the snapshot, taken now
        async with _worker(database_url, schema, started):
            await _entered(database_url, schema)
            await asyncio.sleep(1.0)  # settled: the producer had no transaction id yet
            await aqueue.enqueue("reports", {"n": 1}, conn=producer)
            since = time.monotonic()
            await producer.commit()
            await started.within(1, since)


async def test_busy_workers_leave_and_enqueues_stop_notifying_until_one_waits_again(
    aqueue: leaseq.AsyncQueue, database_url: str, schema: str
) -> None:
    started = Started()
    async with (
        _listening(database_url, aqueue._store.channel) as heard,
        _worker(database_url, schema, started, concurrency=2, seconds=0.02),
    ):
        await _entered(database_url, schema)
        backlog = 600  # ~6 s of work for two slots: its claims come back full
        await aqueue.enqueue_many("reports", [{"n": n} for n in range(backlog)])

        async def left() -> bool:
            return await _entries(database_url, schema) == []

        await _until(left, timeout=wake_entries.LINGER + 3)
        await heard()  # (the backlog's own notification)
        await aqueue.enqueue("reports", {"n": backlog})
        assert await heard() == []  # the worker is busy: nobody woken, nothing sent
        await _until(lambda: _done(started, backlog + 1), timeout=30)
        await _entered(database_url, schema)  # idle again: it waits, and says so
        await asyncio.sleep(0.3)
        since = time.monotonic()
        await aqueue.enqueue("reports", {"n": backlog + 1})
        await started.within(backlog + 1, since)
        assert await heard() == ["reports"]


async def _done(started: Started, count: int) -> bool:
    return len(started.at) >= count


async def test_a_stopped_worker_leaves_its_entries(
    aqueue: leaseq.AsyncQueue, database_url: str, schema: str
) -> None:
    async with _worker(database_url, schema, Started()):
        await _entered(database_url, schema)
    assert await _entries(database_url, schema) == []
    async with _listening(database_url, aqueue._store.channel) as heard:
        await aqueue.enqueue("reports", {"n": 1})
        assert await heard() == []


async def test_a_killed_workers_entries_expire_at_the_reaper(
    aqueue: leaseq.AsyncQueue, database_url: str, schema: str
) -> None:
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
        await conn.execute(  # as killed workers left them: one past its expiry, one not
            f'INSERT INTO "{schema}".queue (name, waiting) VALUES '
            "('reports', jsonb_build_object('gone', extract(epoch FROM now()) - 1)), "
            "('emails', jsonb_build_object('alive', extract(epoch FROM now()) + 60))"
        )
    await aqueue.reap()
    async with _listening(database_url, aqueue._store.channel) as heard:
        await aqueue.enqueue("reports", {"n": 1})
        await aqueue.enqueue("emails", {"n": 2})
        assert await heard() == ["emails"]


async def test_entries_lost_while_the_worker_runs_are_made_again(
    aqueue: leaseq.AsyncQueue, database_url: str, schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The reaper removed a live worker's entries (it was cut off from the
    database past their expiry), or its listener's connection was lost: the
    worker enters again, and its jobs start promptly."""
    monkeypatch.setattr(wake_entries, "ENTRY_SECONDS", 0.4)  # moved on every 0.1 s
    started = Started()
    async with _worker(database_url, schema, started):
        await _entered(database_url, schema)
        async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
            await conn.execute(f"UPDATE \"{schema}\".queue SET waiting = '{{}}'")
            await _entered(database_url, schema)
            await asyncio.sleep(0.3)
            since = time.monotonic()
            await aqueue.enqueue("reports", {"n": 1})
            await started.within(1, since)
            await conn.execute(f"UPDATE \"{schema}\".queue SET waiting = '{{}}'")
            await conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE query = %s",
                (f'LISTEN "{aqueue._store.channel}"',),
            )
        await _entered(database_url, schema)
        await asyncio.sleep(0.3)
        since = time.monotonic()
        await aqueue.enqueue("reports", {"n": 2})
        await started.within(2, since)


async def test_a_worker_that_does_not_listen_enters_nothing(
    aqueue: leaseq.AsyncQueue, database_url: str, schema: str
) -> None:
    started = Started()
    async with _worker(database_url, schema, started, listen=False, poll_interval=0.1):
        since = time.monotonic()
        await aqueue.enqueue("reports", {"n": 1})
        await started.within(1, since)
        assert await _entries(database_url, schema) == []


async def test_workers_and_producers_with_the_documented_grants_wake_and_are_woken(
    aqueue: leaseq.AsyncQueue, database_url: str, schema: str
) -> None:
    """The README's grants: a worker role enters (and leaves) the queue's row, a
    producer role reads it and notifies."""
    with restricted_roles(database_url, schema) as roles:
        started = Started()
        async with (
            leaseq.AsyncQueue(roles.producer, schema=schema) as producer,
            _worker(roles.worker, schema, started),
        ):
            await _entered(database_url, schema)
            await asyncio.sleep(0.3)
            since = time.monotonic()
            await producer.enqueue("reports", {"n": 1})
            await started.within(1, since)
        assert await _entries(database_url, schema) == []  # left at the stop
