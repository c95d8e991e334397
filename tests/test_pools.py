"""A client's pool opens on first use, once, for every caller that arrives while
it opens; closed, it opens again on the next use.

The opening is slowed down on purpose: a thread switch in the middle of the
pool's open (rare, but seen in CI: a burst worker's first handlers got "the pool
'leaseq' is not open yet" and their jobs went back to the queue) becomes certain.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from psycopg_pool import AsyncConnectionPool, ConnectionPool

import leaseq
from leaseq import JobStatus

#: How long the pool's open is held up: long enough for every other caller to arrive.
SLOW_OPEN = 0.2
CALLERS = 8


@pytest.fixture
def slow_open(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every pool takes SLOW_OPEN seconds to start opening (a descheduled thread)."""
    sync_open: Callable[..., None] = ConnectionPool.open
    async_open: Callable[..., Any] = AsyncConnectionPool.open

    def open_later(pool: ConnectionPool, *args: Any, **kwargs: Any) -> None:
        time.sleep(SLOW_OPEN)
        sync_open(pool, *args, **kwargs)

    async def aopen_later(pool: AsyncConnectionPool, *args: Any, **kwargs: Any) -> None:
        await asyncio.sleep(SLOW_OPEN)
        await async_open(pool, *args, **kwargs)

    monkeypatch.setattr(ConnectionPool, "open", open_later)
    monkeypatch.setattr(AsyncConnectionPool, "open", aopen_later)


@pytest.mark.usefixtures("slow_open")
def test_threads_that_arrive_while_the_pool_opens_all_get_a_connection(
    database_url: str,
) -> None:
    errors: list[BaseException] = []
    answers: list[int] = []
    start = threading.Barrier(CALLERS)

    def use(queue: leaseq.Queue, n: int) -> None:
        start.wait()
        time.sleep(0.01 * n)  # the first opens; the others come while it does
        try:
            with queue.connection() as conn:
                row = conn.execute("SELECT %s::int", (n,)).fetchone()
                assert row is not None
                answers.append(row[0])
        except BaseException as exc:
            errors.append(exc)

    with leaseq.Queue(database_url) as queue:
        threads = [threading.Thread(target=use, args=(queue, n)) for n in range(CALLERS)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
    assert errors == []
    assert sorted(answers) == list(range(CALLERS))


@pytest.mark.usefixtures("slow_open")
async def test_tasks_that_arrive_while_the_pool_opens_all_get_a_connection(
    database_url: str,
) -> None:
    async def use(queue: leaseq.AsyncQueue, n: int) -> int:
        await asyncio.sleep(0.01 * n)
        async with queue.connection() as conn:
            row = await (await conn.execute("SELECT %s::int", (n,))).fetchone()
            assert row is not None
            answer: int = row[0]
            return answer

    async with leaseq.AsyncQueue(database_url) as queue:
        answers = await asyncio.gather(*(use(queue, n) for n in range(CALLERS)))
    assert sorted(answers) == list(range(CALLERS))


@pytest.mark.usefixtures("slow_open")
async def test_a_workers_first_sync_handlers_all_reach_the_database(
    aqueue: leaseq.AsyncQueue, database_url: str, schema: str
) -> None:
    """The CI failure itself: four handler threads of a new worker each ask for a
    connection at once, while the handlers' pool is still opening."""
    app = leaseq.App(schema=schema)

    @app.task("reports")
    def handler(job: leaseq.JobContext) -> None:
        with job.connection() as conn:
            conn.execute("SELECT 1")

    ids = await aqueue.enqueue_many("reports", [{} for _ in range(4)])
    worker = leaseq.Worker(app, dsn=database_url, concurrency=4, poll_interval=0.1)
    await asyncio.wait_for(worker.run(burst=True), 60)
    jobs = [await aqueue.get(job_id) for job_id in ids]
    # each one done at its first attempt: no handler met a pool that was not open
    assert [(job.status, job.attempts) for job in jobs] == [(JobStatus.DONE, 1)] * 4, [
        job.history for job in jobs
    ]


@pytest.mark.parametrize("closes", [1, 2])
def test_a_closed_queue_opens_again_on_its_next_use(database_url: str, closes: int) -> None:
    queue = leaseq.Queue(database_url)
    for _ in range(closes):
        with queue.connection() as conn:
            conn.execute("SELECT 1")
        queue.close()
    with queue.connection() as conn:
        assert conn.execute("SELECT 2").fetchone() == (2,)
    queue.close()
    queue.close()  # closing a closed queue changes nothing


@pytest.mark.parametrize("closes", [1, 2])
async def test_a_closed_async_queue_opens_again_on_its_next_use(
    database_url: str, closes: int
) -> None:
    queue = leaseq.AsyncQueue(database_url)
    for _ in range(closes):
        async with queue.connection() as conn:
            await conn.execute("SELECT 1")
        await queue.close()
    async with queue.connection() as conn:
        assert await (await conn.execute("SELECT 2")).fetchone() == (2,)
    await queue.close()
    await queue.close()
