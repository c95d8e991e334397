"""A client's pool opens on first use, once, for every caller that arrives while
it opens; closed, it opens again on the next use.

The opening is slowed down on purpose: a thread switch in the middle of the
pool's open (rare, but seen in CI: a burst worker's first handlers got "the pool
'leaseq' is not open yet" and their jobs went back to the queue) becomes certain.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import make_conninfo
from psycopg_pool import AsyncConnectionPool, ConnectionPool

import leaseq
import leaseq._db.pool_rules
from leaseq import JobStatus
from leaseq._db import AsyncDatabase, listening
from leaseq._worker import connections
from leaseq.testing import adrain

from .conftest import SpareDatabase
from .scripts import run_script

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


# -- a database that is not there at first --------------------------------------------


def test_a_queue_whose_first_use_found_no_database_works_once_there_is_one(
    spare_database: SpareDatabase,
) -> None:
    queue = leaseq.Queue(spare_database.dsn, connect_timeout=1)
    for _ in range(2):  # each use while it is missing says so, typed
        with pytest.raises(leaseq.DatabaseUnavailable, match="does not exist"):
            queue.stats()
    spare_database.create()
    queue.migrate()
    job_id = queue.enqueue("reports", {})
    assert queue.get(job_id).status is JobStatus.QUEUED
    queue.close()


async def test_an_async_queue_whose_first_use_found_no_database_works_once_there_is_one(
    spare_database: SpareDatabase,
) -> None:
    queue = leaseq.AsyncQueue(spare_database.dsn, connect_timeout=1)
    for _ in range(2):
        with pytest.raises(leaseq.DatabaseUnavailable, match="does not exist"):
            await queue.stats()
    spare_database.create()
    await queue.migrate()
    job_id = await queue.enqueue("reports", {})
    assert (await queue.get(job_id)).status is JobStatus.QUEUED
    await queue.close()


def test_connection_options_the_server_refuses_are_named_as_the_reason(
    database_url: str,
) -> None:
    """(A pooler refuses the worker sessions' server options so.) The diagnosis
    connects with the pool's own options: it finds the pool's failure, not a
    "timed out" of a connection that worked."""
    options = {"autocommit": True, "options": "-c no_such_setting=1"}
    queue = leaseq.Queue(database_url, connection_options=options, connect_timeout=1)
    with pytest.raises(leaseq.DatabaseUnavailable, match="no_such_setting"):
        queue.stats()


async def test_async_connection_options_the_server_refuses_are_named_as_the_reason(
    database_url: str,
) -> None:
    options = {"autocommit": True, "options": "-c no_such_setting=1"}
    queue = leaseq.AsyncQueue(database_url, connection_options=options, connect_timeout=1)
    with pytest.raises(leaseq.DatabaseUnavailable, match="no_such_setting"):
        await queue.stats()


# -- a database that went away ------------------------------------------------------

#: Longer than psycopg's pool's first retries of a lost connection (1, 2 then 4
#: seconds apart): its next one would come about 7 seconds after the first.
OUTAGE = 6.0
#: A call's bound with connect_timeout=2: its wait, then the diagnosis' connect.
CALL_BOUND = 6.0


@pytest.mark.server_agnostic  # the pools' behaviour, the same on any server
def test_a_queue_whose_database_went_away_works_as_soon_as_it_is_back(
    spare_database: SpareDatabase,
) -> None:
    spare_database.create()
    with leaseq.Queue(spare_database.dsn, connect_timeout=2) as queue:
        queue.migrate()
        job_id = queue.enqueue("reports", {})
        spare_database.refuse_connections()
        began = time.monotonic()
        while time.monotonic() - began < OUTAGE:
            call = time.monotonic()
            with pytest.raises(leaseq.TransientError):  # DatabaseUnavailable is one
                queue.stats()
            assert time.monotonic() - call < CALL_BOUND  # connect_timeout bounds each wait
        spare_database.accept_connections()
        # The first call after: not a retry of the old pool seconds later.
        assert queue.get(job_id).status is JobStatus.QUEUED


@pytest.mark.server_agnostic
async def test_an_async_queue_whose_database_went_away_works_as_soon_as_it_is_back(
    spare_database: SpareDatabase,
) -> None:
    spare_database.create()
    async with leaseq.AsyncQueue(spare_database.dsn, connect_timeout=2) as queue:
        await queue.migrate()
        job_id = await queue.enqueue("reports", {})
        spare_database.refuse_connections()
        began = time.monotonic()
        while time.monotonic() - began < OUTAGE:
            call = time.monotonic()
            with pytest.raises(leaseq.TransientError):
                await queue.stats()
            assert time.monotonic() - call < CALL_BOUND
        spare_database.accept_connections()
        assert (await queue.get(job_id)).status is JobStatus.QUEUED


@pytest.fixture
def slow_connections(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every connection takes a second to be made (a server slow to accept): longer
    than a pool attempt, cut to 0.3 seconds."""
    monkeypatch.setattr(leaseq._db.pool_rules, "POOL_ATTEMPT_SECONDS", 0.3)
    sync_connect = psycopg.Connection.connect
    async_connect = psycopg.AsyncConnection.connect

    def connect_slowly(*args: Any, **kwargs: Any) -> psycopg.Connection[Any]:
        time.sleep(1.0)
        return sync_connect(*args, **kwargs)

    async def aconnect_slowly(*args: Any, **kwargs: Any) -> psycopg.AsyncConnection[Any]:
        await asyncio.sleep(1.0)
        return await async_connect(*args, **kwargs)

    monkeypatch.setattr(psycopg.Connection, "connect", connect_slowly)
    monkeypatch.setattr(psycopg.AsyncConnection, "connect", aconnect_slowly)


@pytest.mark.usefixtures("slow_connections")
def test_a_connection_slow_to_be_made_is_waited_for(database_url: str, schema: str) -> None:
    """Not taken for a failing one: no new pool cuts it short."""
    with leaseq.Queue(database_url, schema=schema, connect_timeout=10) as queue:
        queue.migrate()
        assert queue.stats() == []


@pytest.mark.usefixtures("slow_connections")
async def test_an_async_connection_slow_to_be_made_is_waited_for(
    database_url: str, schema: str
) -> None:
    async with leaseq.AsyncQueue(database_url, schema=schema, connect_timeout=10) as queue:
        await queue.migrate()
        assert await queue.stats() == []


def test_a_busy_pool_is_waited_for_not_dropped(
    database_url: str, schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every connection lent (a busy application, not a database away): a caller
    waits for one past a pool attempt's seconds, and gets one of the same pool."""
    monkeypatch.setattr(leaseq._db.pool_rules, "POOL_ATTEMPT_SECONDS", 0.3)
    with leaseq.Queue(database_url, schema=schema, pool_size=1, connect_timeout=30) as queue:
        queue.migrate()
        got: list[int] = []
        with queue.connection() as held:
            pid = held.info.backend_pid

            def other() -> None:
                with queue.connection() as conn:
                    got.append(conn.info.backend_pid)

            thread = threading.Thread(target=other)
            thread.start()
            time.sleep(1.0)  # three attempts' time
        thread.join(10)
        assert got == [pid]  # the same connection: the pool was neither dropped nor doubled


async def test_a_worker_started_while_its_database_refuses_connections_works_once_it_accepts(
    spare_database: SpareDatabase, monkeypatch: pytest.MonkeyPatch
) -> None:
    """It keeps trying (its pools fail to open, more than once), and runs the job once
    the database takes connections again."""
    dsn = spare_database.dsn
    spare_database.create()
    async with leaseq.AsyncQueue(dsn) as queue:
        await queue.migrate()
        job_id = await queue.enqueue("reports", {})

    # The worker's pools give up opening after 1 s instead of 30: several fail in a test.
    monkeypatch.setattr(connections, "Queue", functools.partial(leaseq.Queue, connect_timeout=1))
    monkeypatch.setattr(
        connections, "AsyncQueue", functools.partial(leaseq.AsyncQueue, connect_timeout=1)
    )
    app = leaseq.App()
    ran: list[int] = []

    @app.task("reports")
    async def handler(job: leaseq.JobContext) -> None:
        ran.append(job.job_id)

    spare_database.refuse_connections()
    worker = leaseq.Worker(app, dsn=dsn, concurrency=2, poll_interval=0.1)
    running = asyncio.create_task(worker.run())
    await asyncio.sleep(4)  # several pools fail to open meanwhile
    assert not running.done(), running.exception()
    assert ran == []
    spare_database.accept_connections()
    async with leaseq.AsyncQueue(dsn) as queue:
        deadline = time.monotonic() + 60
        while (await queue.get(job_id)).status is not JobStatus.DONE:
            assert time.monotonic() < deadline, "the worker never ran the job"
            assert not running.done(), running.exception()
            await asyncio.sleep(0.1)
    worker.request_stop()
    await asyncio.wait_for(running, 30)
    assert ran == [job_id]


# -- a server that accepts and never answers -------------------------------------------


@pytest.fixture
def silent_server() -> Iterator[str]:
    """A DSN of a loopback socket that accepts connections and never says a word."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(100)
    yield f"postgresql://postgres@127.0.0.1:{server.getsockname()[1]}/postgres"
    server.close()


#: connect_timeout=3 took 11 s: the timeout, then up to 5 s while the pool that
#: timed out joined its attempt in flight, then a diagnosis connection of up to 5 s.
#: What a call may take past its timeout on a loaded machine.
PAST_THE_TIMEOUT = 2.5


@pytest.mark.server_agnostic
@pytest.mark.parametrize("timeout", [2, 7])  # one pool's window (5 s), and two
def test_a_server_that_never_answers_is_given_up_at_the_connect_timeout(
    silent_server: str, timeout: int
) -> None:
    started = time.monotonic()
    with (
        leaseq.Queue(silent_server, connect_timeout=timeout) as queue,
        pytest.raises(leaseq.DatabaseUnavailable) as unavailable,
    ):
        queue.stats()
    elapsed = time.monotonic() - started
    assert timeout - 0.5 < elapsed < timeout + PAST_THE_TIMEOUT, elapsed
    assert not isinstance(unavailable.value, leaseq.InvalidDatabaseURL)  # it may answer later


@pytest.mark.server_agnostic
@pytest.mark.parametrize("timeout", [2, 7])
async def test_an_async_call_to_a_server_that_never_answers_ends_at_the_connect_timeout(
    silent_server: str, timeout: int
) -> None:
    async with leaseq.AsyncQueue(silent_server, connect_timeout=timeout) as queue:
        started = time.monotonic()
        with pytest.raises(leaseq.DatabaseUnavailable) as unavailable:
            await queue.stats()
        elapsed = time.monotonic() - started
    assert timeout - 0.5 < elapsed < timeout + PAST_THE_TIMEOUT, elapsed
    assert not isinstance(unavailable.value, leaseq.InvalidDatabaseURL)


@pytest.mark.server_agnostic
async def test_a_session_on_a_server_that_never_answers_ends_at_the_connect_timeout(
    silent_server: str,
) -> None:
    """The worker's LISTEN and maintenance sessions connect outside the pool: with
    no libpq connect_timeout they waited for ever on such a server."""
    database = AsyncDatabase(silent_server, open_timeout=2)
    started = time.monotonic()
    with pytest.raises(leaseq.DatabaseUnavailable):
        async with asyncio.timeout(60), database.session():
            pass
    assert time.monotonic() - started < 2 + PAST_THE_TIMEOUT


async def test_async_callers_while_the_database_is_away_share_one_failed_open(
    silent_server: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ten requests at once, the database away: one open, one wait, ten typed
    answers (not one connect timeout after another); and meanwhile the loop's other
    tasks (a worker's renewals) keep running: no blocking connect on the loop."""
    opens: list[AsyncConnectionPool] = []
    open_pool = AsyncConnectionPool.open

    async def counted_open(pool: AsyncConnectionPool, *args: Any, **kwargs: Any) -> None:
        opens.append(pool)
        await open_pool(pool, *args, **kwargs)

    monkeypatch.setattr(AsyncConnectionPool, "open", counted_open)
    longest_gap = 0.0

    async def ticker() -> None:
        nonlocal longest_gap
        last = time.monotonic()
        while True:
            await asyncio.sleep(0.01)
            now = time.monotonic()
            longest_gap, last = max(longest_gap, now - last), now

    ticking = asyncio.create_task(ticker())
    queue = leaseq.AsyncQueue(silent_server, connect_timeout=1)
    answers = await asyncio.gather(*(queue.stats() for _ in range(10)), return_exceptions=True)
    await asyncio.sleep(0.05)  # the ticker's next tick records a stall just ended
    ticking.cancel()
    assert [type(answer) for answer in answers] == [leaseq.DatabaseUnavailable] * 10
    assert len(opens) == 1  # (a later call tries again: the missing-database tests above)
    # a connect attempt is 2 s at least (libpq's minimum): a blocked loop shows it
    assert longest_gap < 1.0


def test_threads_that_waited_behind_a_failed_open_share_its_failure(
    silent_server: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    opens: list[ConnectionPool] = []
    open_pool = ConnectionPool.open

    def counted_open(pool: ConnectionPool, *args: Any, **kwargs: Any) -> None:
        opens.append(pool)
        open_pool(pool, *args, **kwargs)

    monkeypatch.setattr(ConnectionPool, "open", counted_open)
    queue = leaseq.Queue(silent_server, connect_timeout=1)
    errors: list[BaseException] = []

    def call() -> None:
        try:
            queue.stats()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=call) for _ in range(5)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert [type(error) for error in errors] == [leaseq.DatabaseUnavailable] * 5
    assert len(opens) == 1


def test_wait_result_against_a_server_that_never_answers_ends(
    silent_server: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(listening, "LISTEN_CONNECT_SECONDS", 2)  # libpq's least, for speed
    outcome: list[BaseException] = []

    def call() -> None:
        try:
            leaseq.Queue(silent_server, connect_timeout=1).wait_result(1, timeout=1)
        except BaseException as exc:
            outcome.append(exc)

    waiting = threading.Thread(target=call, daemon=True)
    waiting.start()
    waiting.join(60)
    assert not waiting.is_alive(), "wait_result still waiting for a connection"
    assert [type(exc) for exc in outcome] == [leaseq.DatabaseUnavailable]


# -- cancellations ----------------------------------------------------------------------


@pytest.mark.parametrize("turns", [0, 1, 2, 3, 4])
async def test_a_close_cancelled_midway_leaves_a_queue_that_opens_again(
    database_url: str, turns: int
) -> None:
    queue = leaseq.AsyncQueue(database_url)
    async with queue.connection() as conn:
        await conn.execute("SELECT 1")
    closing = asyncio.create_task(queue.close())
    for _ in range(turns):
        await asyncio.sleep(0)
    closing.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await closing
    async with queue.connection() as conn:
        assert await (await conn.execute("SELECT 2")).fetchone() == (2,)
    await queue.close()


async def test_wait_result_keeps_a_cancellation_that_arrives_as_it_stops_listening(
    aqueue: leaseq.AsyncQueue, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The job is done; the caller is cancelled while wait_result closes its LISTEN
    connection: the caller must end cancelled, not with the result."""
    job_id = await aqueue.enqueue("reports", {})
    (claim,) = await aqueue.claim("reports")
    await aqueue.complete(claim, result={"answer": 42})
    closing = asyncio.Event()
    close = psycopg.AsyncConnection.close

    async def observed_close(conn: psycopg.AsyncConnection[Any]) -> None:
        if not closing.is_set():
            closing.set()
            await asyncio.sleep(0)  # a close takes a loop turn at least
        await close(conn)

    monkeypatch.setattr(psycopg.AsyncConnection, "close", observed_close)
    waiting = asyncio.create_task(aqueue.wait_result(job_id, timeout=10))
    await closing.wait()
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting


# -- the URL's own settings ---------------------------------------------------------


async def test_the_urls_server_options_and_name_hold_on_every_connection_leaseq_makes(
    queue: leaseq.Queue, database_url: str, schema: str
) -> None:
    """psycopg's keyword arguments override the URL's: a worker's handlers (and a
    client with a statement_timeout) lost the URL's search_path and lock_timeout,
    so a handler's unqualified INSERT went to another schema than the producer's;
    and every connection was named "leaseq" whatever the URL said."""
    url = make_conninfo(
        database_url,
        options="-c search_path=billing -c lock_timeout=4321",
        application_name="billing-app",
    )
    shown = (
        "SELECT current_setting('search_path'), current_setting('lock_timeout'),"
        " current_setting('application_name')"
    )
    expected = ("billing", "4321ms", "billing-app")
    with (
        leaseq.Queue(url, schema=schema, statement_timeout=5) as timed,
        timed.connection() as conn,
    ):
        assert conn.execute(shown).fetchone() == expected
        assert conn.execute("SHOW statement_timeout").fetchone() == ("5s",)
    app = leaseq.App(schema=schema)
    seen: list[Any] = []

    @app.task("work")
    def handler(job: leaseq.JobContext) -> None:
        with job.connection() as conn:
            seen.append(conn.execute(shown).fetchone())

    queue.enqueue("work", {})
    await adrain(app, dsn=url, timeout=30)
    assert seen == [expected]


def test_a_queue_used_before_a_fork_serves_each_process_its_own_answers(
    database_url: str, schema: str, queue: leaseq.Queue
) -> None:
    """gunicorn --preload: a module-level Queue, used at import, then by four
    forked children and the parent at once. The children shared the parent's
    pool: an enqueue returned another process's job, and children hung."""
    run_script("preload_fork.py", schema, database_url)
    page = queue.find_jobs(queue="preload", status=None, limit=1000)
    payloads = sorted((j.payload.get("child", -1), j.payload.get("n", -1)) for j in page.jobs)
    assert payloads == sorted([(-1, -1), (-1, -1)] + [(c, n) for c in range(4) for n in range(25)])
