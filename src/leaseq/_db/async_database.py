"""The async client's pool: :class:`AsyncDatabase`, the twin of
:class:`~.database.Database` (``tests/test_api.py`` holds them to the same
methods and docstrings), and the worker's sessions outside the pool
(:class:`Session`: its leader lock, its LISTEN)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any, TypeVar

import psycopg
from psycopg_pool import AsyncConnectionPool, PoolClosed, PoolTimeout

from .._lends import note_lend
from .._statement import Operation, Plan, Rows, Statement, Steps
from .._waiting import raise_if_cancelling
from . import forks
from .errors import malformed_dsn, parsable, read_only_server, translated_errors, unavailable
from .execution import AsyncConnection, adrive, aexecute, callers, retryable
from .listening import SharedListener, asleeping
from .options import CONNECTION_OPTIONS, under_the_url
from .pool_rules import (
    READY_SECONDS,
    ConnectWatch,
    OpenFailures,
    areset_session,
    areset_state,
    attempt_timeout,
    bounded_attempts,
    closed_by_server,
    failing,
    pool_settings,
)

T = TypeVar("T")

#: How long what undoes an operation for a cancelled caller may take (the claim's
#: release): a database that does not answer must not hold the cancellation.
UNDO_SECONDS = 5.0


class AsyncDatabase:
    """A lazily opened pool of autocommit connections (asyncio); opened, dropped
    and opened again as :class:`Database`'s."""

    def __init__(
        self,
        dsn: str,
        *,
        min_size: int = 1,
        max_size: int = 10,
        options: dict[str, Any] | None = None,
        open_timeout: float = 30.0,
        listen: bool = True,
    ) -> None:
        self.dsn = dsn
        self.open_timeout = open_timeout
        #: Whether :meth:`notified` LISTENs (not behind a transaction pooler).
        self._listen = listen
        #: One LISTEN connection per statement, shared by every waiter.
        self._listeners: dict[str, SharedListener] = {}
        self._options = under_the_url(dsn, options or CONNECTION_OPTIONS)
        self._settings = pool_settings(dsn, min_size, max_size, self._options, open_timeout)
        #: The open pool; None until the first use, and again after a close.
        self._pool: AsyncConnectionPool | None = None
        self._lock = asyncio.Lock()
        self._failures = OpenFailures()
        #: How many of the pool's connections are lent now.
        self._lent = 0
        #: Dropped pools being closed in the background (awaited by close()).
        self._closing: set[asyncio.Task[None]] = set()
        forks.track(self)

    def forget_after_fork(self) -> object:
        """In a forked child: the parent's pool, locks and tasks are not ours (see forks)."""
        kept = (self._pool, self._lock, self._closing, self._listeners)
        self._pool = None
        self._listeners = {}  # the parent's listener connection is not ours
        self._lock = asyncio.Lock()
        self._failures = OpenFailures()
        self._lent = 0
        self._closing = set()
        return kept

    async def _open_pool(self, deadline: float) -> AsyncConnectionPool:
        pool = self._pool
        if pool is None:
            seen = self._failures.count
            async with self._lock:
                pool = self._pool
                if pool is None:
                    self._failures.raise_if_since(seen)
                    pool = await self._new_pool(deadline)
                    self._pool = pool  # only once open: callers without the lock use it
        return pool

    async def _new_pool(self, deadline: float) -> AsyncConnectionPool:
        """An open pool, new pools tried until ``deadline``."""
        if (malformed := malformed_dsn(self.dsn)) is not None:  # no pool can connect with it
            raise self._failures.record(malformed)
        slow = False  # a connection slow to succeed (not failing) gets all the time
        while True:
            watch = ConnectWatch()
            pool = AsyncConnectionPool(
                **self._settings,
                connection_class=watch.async_connection_class(),
            )
            try:
                window = attempt_timeout(deadline, slow)
                started = time.monotonic()
                await pool.open(wait=False)
                if await watch.await_(window):
                    if watch.refusal is not None:  # no retry can connect: said at once
                        raise self._failures.record(watch.refusal)
                    await pool.wait(max(window - (time.monotonic() - started), READY_SECONDS))
                    # The pool waits with asyncio.wait_for, which on Python 3.11 returns
                    # when the first connection and a cancellation of this task arrive
                    # together: the cancellation must not be lost.
                    raise_if_cancelling()
                    return pool
                # Not waited for: an attempt still in flight ends at its connect_timeout.
                self._close_in_background(pool)
            except PoolTimeout:  # the pool closed itself
                pass
            except BaseException:
                await pool.close()
                raise
            slow = watch.failure is None  # slow to answer, not failing: all the time next
            if time.monotonic() >= deadline:
                raise self._failures.record(watch.unavailable(self.open_timeout)) from None

    @asynccontextmanager
    async def connection(self, reset: Statement | None = None) -> AsyncIterator[AsyncConnection]:
        """A connection of the pool (autocommit), back in the pool afterwards; with
        ``reset`` (a caller's own SQL ran on it), its session reset first."""
        with translated_errors():
            deadline = time.monotonic() + self.open_timeout
            while True:
                pool = await self._open_pool(deadline)
                try:
                    conn = await pool.getconn(attempt_timeout(deadline, self._lent > 0))
                except PoolClosed:  # closed by close() once this caller had it: a new one
                    self._forget(pool)
                    continue
                except PoolTimeout:
                    if time.monotonic() >= deadline:
                        raise
                    self._drop_if_failing(pool)
                    continue
                if not closed_by_server(conn):
                    # As the pool made it (autocommit, writable), whatever its last
                    # user set: here, not as the pool's reset=, which psycopg_pool
                    # runs in a worker thread, the connection away meanwhile (+100 us
                    # an enqueue, measured).
                    await areset_state(conn, self._options)
                    break
                await pool.putconn(conn)  # discarded: the pool makes another
            self._lent += 1
            note_lend()  # (the worker's leases run from no earlier than this: _lends)
            try:
                async with conn:  # as psycopg's pool.connection(): ends a transaction left open
                    yield conn
            except Exception as exc:
                if (read_only := read_only_server(exc)) is None:
                    raise
                await conn.close()  # as Database's: a new pool on the next use
                self._drop(pool)
                raise read_only from exc
            finally:
                self._lent -= 1
                try:
                    if reset is not None:
                        await areset_session(conn, reset.sql)
                finally:
                    await pool.putconn(conn)

    def _forget(self, pool: AsyncConnectionPool) -> None:
        if self._pool is pool:
            self._pool = None

    def _drop_if_failing(self, pool: AsyncConnectionPool) -> None:
        """Drop ``pool`` if none of its connections is lent (it has none) and its
        attempts fail; closed in the background, its retries with it."""
        if self._lent or not failing(pool):
            return  # busy, or slow to connect: waited for
        self._drop(pool)

    def _drop(self, pool: AsyncConnectionPool) -> None:
        """The next use opens a new pool; ``pool`` is closed in the background (a
        connection lent from it is closed when given back)."""
        if self._pool is not pool:
            return  # dropped already
        self._pool = None
        self._close_in_background(pool)

    def _close_in_background(self, pool: AsyncConnectionPool) -> None:
        """Close ``pool`` in the background (a thread; a task that close() awaits):
        no caller waits for its attempt in flight (psycopg waits up to 5 s for it)."""
        closing = asyncio.get_running_loop().create_task(pool.close())
        self._closing.add(closing)
        closing.add_done_callback(self._closing.discard)

    async def run(self, operation: Operation[T], conn: AsyncConnection | None = None) -> T:
        """Run one operation on ``conn`` (the caller's), else on a pool connection.
        One that committed there although its caller was interrupted meanwhile (a
        task cancelled, Ctrl-C) is undone (``Operation.undo``) before the
        interruption propagates."""
        if conn is not None:
            return await aexecute(callers(conn, psycopg.AsyncConnection), operation, theirs=True)
        attempt = 0
        answered: list[Rows] = []
        try:
            while True:
                async with self.connection() as own:
                    try:
                        return await aexecute(own, operation, answered)
                    except Exception as exc:
                        if not retryable(operation, exc, attempt):
                            raise
                attempt += 1
        except BaseException:
            if answered:
                await self._undo(operation, answered)
            raise

    async def _undo(self, operation: Operation[T], answered: list[Rows]) -> None:
        """Undo ``operation``, which ``answered`` although its caller was interrupted
        (asyncio: within UNDO_SECONDS); a failure is left to what it undoes (a
        claim's leases end): the interruption is what propagates."""
        if operation.undo is None:
            return
        with contextlib.suppress(Exception):
            undo = operation.undo(operation.decode(answered))
            if undo is not None:
                async with asyncio.timeout(UNDO_SECONDS):
                    await self.run(undo)

    async def run_steps(self, steps: Steps[T], conn: AsyncConnection | None = None) -> T:
        """Run each operation the steps yield, sending back its result. An error is
        raised into the steps, which may act on it (an interrupted claim gives back
        what it took: asyncio, each operation within UNDO_SECONDS)."""
        callers(conn, psycopg.AsyncConnection)
        interrupted = False
        try:
            operation = next(steps)
            while True:
                on = None if operation.detached else conn
                try:
                    if interrupted:
                        async with asyncio.timeout(UNDO_SECONDS):
                            result = await self.run(operation, on)
                    else:
                        result = await self.run(operation, on)
                except BaseException as exc:
                    interrupted = interrupted or not isinstance(exc, Exception)
                    operation = steps.throw(exc)
                    continue
                operation = steps.send(result)
        except StopIteration as done:
            value: T = done.value
            return value
        finally:
            steps.close()

    async def drive(self, plan: Plan) -> list[int]:
        """Run a statement plan (migrations) in one transaction."""
        async with self.connection() as conn:
            return await adrive(conn, plan)

    def notified(
        self, statement: Statement
    ) -> AbstractAsyncContextManager[Callable[[float], Awaitable[None]]]:
        """``wait(seconds)``, cut short by a notification on what ``statement``
        LISTENs to (:mod:`.listening`); without ``listen``, a plain sleep."""
        if not self._listen:
            return asleeping()
        shared = self._listeners.get(statement.sql)
        if shared is None:
            shared = self._listeners[statement.sql] = SharedListener(
                self.dsn, self._options, statement
            )
        return shared.waiting()

    async def close(self) -> None:
        """Close the pool (a new one opens on the next use)."""
        async with self._lock:
            # Dropped before the wait: a close cancelled midway leaves no closed
            # pool behind for the next use.
            pool, self._pool = self._pool, None
        if pool is not None:
            await pool.close()
        if self._closing:
            await asyncio.gather(*self._closing, return_exceptions=True)

    # -- sessions outside the pool (asyncio only: the worker's) --------------------

    @asynccontextmanager
    async def session(self) -> AsyncIterator[Session]:
        """A connection of its own, outside the pool, for session state (an advisory
        lock held for as long as the session lives)."""
        with translated_errors():
            try:
                conn = await psycopg.AsyncConnection.connect(
                    parsable(self.dsn),
                    **bounded_attempts(self.dsn, self._options, self.open_timeout),
                )
            except psycopg.OperationalError as exc:  # as a pool's failed open says it
                raise_if_cancelling(exc)
                raise unavailable(exc) from exc
        async with conn:
            try:
                yield Session(conn)
            except Exception as exc:  # (the connection is closed on the way out)
                if (read_only := read_only_server(exc)) is None:
                    raise
                raise read_only from exc

    async def listen(self, statement: Statement) -> AsyncIterator[str]:
        """Notification payloads from a session of their own, until it breaks
        (TransientError); first an empty payload once listening."""
        async with self.session() as session:
            with translated_errors():
                await session.conn.execute(statement.sql)
                yield ""  # listening now: the caller may poll for what it missed
                async for notification in session.conn.notifies():
                    yield notification.payload


class Session:
    """One dedicated connection: operations run on it one at a time."""

    def __init__(self, conn: AsyncConnection) -> None:
        self.conn = conn

    async def run(self, operation: Operation[T]) -> T:
        return await aexecute(self.conn, operation)
