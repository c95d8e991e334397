"""The only package that talks to the driver: pools (here), execution
(``execution``), the connections' settings (``options``) and the error mapping
(``errors``).

``_store`` builds :class:`~leaseq._statement.Operation` values (and steps of
them); this module runs them on psycopg 3 connections, sync or async, and turns
the driver's errors into leaseq's typed errors, so that nothing above it needs
to know psycopg's exception classes: errors that say "try again later" become
:class:`TransientError`, those that mean something to users their own types.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import (
    AbstractAsyncContextManager,
    AbstractContextManager,
    asynccontextmanager,
    contextmanager,
)
from typing import Any, TypeVar

import psycopg
from psycopg_pool import AsyncConnectionPool, ConnectionPool, PoolTimeout

from .._errors import DatabaseUnavailable
from .._statement import Operation, Plan, Statement, Steps
from .._waiting import raise_if_cancelling
from .errors import aunreachable, translated_errors, unreachable
from .execution import (
    AsyncConnection,
    Connection,
    adrive,
    aexecute,
    drive,
    execute,
    retryable,
)
from .listening import anotified, notified
from .options import (
    ASYNC_ACKNOWLEDGEMENT_OPTIONS,
    CONNECTION_OPTIONS,
    SERVICE_OPTIONS,
    WORKER_OPTIONS,
    with_statement_timeout,
)

# Re-exported: what the clients need of the connections' settings.
__all__ = [
    "ASYNC_ACKNOWLEDGEMENT_OPTIONS",
    "SERVICE_OPTIONS",
    "WORKER_OPTIONS",
    "AsyncConnection",
    "AsyncDatabase",
    "Connection",
    "Database",
    "Session",
    "translated_errors",
    "with_statement_timeout",
]

T = TypeVar("T")


def _pool_settings(
    dsn: str, min_size: int, max_size: int, options: dict[str, Any] | None
) -> dict[str, Any]:
    return {
        "conninfo": dsn,
        "kwargs": options or CONNECTION_OPTIONS,
        "min_size": min_size,
        "max_size": max_size,
        "open": False,
        "name": "leaseq",
    }


class _OpenFailures:
    """The failed openings of a client's pool. Callers that waited for the lock
    while an opening failed share its failure, rather than each waiting out an
    open timeout of its own in turn (with the database away, the tenth request of
    a web server would have waited ten timeouts)."""

    def __init__(self) -> None:
        self.count = 0
        self._last = ""

    def record(self, error: DatabaseUnavailable) -> DatabaseUnavailable:
        self.count += 1
        self._last = str(error)
        return error

    def raise_if_since(self, seen: int) -> None:
        """Raise the last failure if one came after the caller read ``count``."""
        if self.count != seen:
            raise DatabaseUnavailable(self._last)


class Database:
    """A lazily opened pool of autocommit connections (sync).

    The pool is made and opened by its first user, under a lock: callers that
    arrive meanwhile wait for it, and none sees a pool that is not open yet. A
    pool that could not open (psycopg closes it) or that :meth:`close` closed is
    dropped, and the next use opens a new one: a psycopg pool cannot reopen.
    """

    def __init__(
        self,
        dsn: str,
        *,
        min_size: int = 1,
        max_size: int = 10,
        options: dict[str, Any] | None = None,
        open_timeout: float = 30.0,
    ) -> None:
        self.dsn = dsn
        self.open_timeout = open_timeout
        self._options = options or CONNECTION_OPTIONS
        self._settings = _pool_settings(dsn, min_size, max_size, options)
        #: The open pool; None until the first use, and again after a close.
        self._pool: ConnectionPool | None = None
        self._lock = threading.Lock()
        self._failures = _OpenFailures()

    def _open_pool(self) -> ConnectionPool:
        pool = self._pool
        if pool is None:
            seen = self._failures.count
            with self._lock:
                pool = self._pool
                if pool is None:
                    self._failures.raise_if_since(seen)
                    pool = ConnectionPool(**self._settings)
                    try:
                        pool.open(wait=True, timeout=self.open_timeout)
                    except PoolTimeout:  # the pool closed itself
                        error = unreachable(self.dsn, self.open_timeout)
                        raise self._failures.record(error) from None
                    except BaseException:
                        pool.close()
                        raise
                    self._pool = pool  # only once open: callers without the lock use it
        return pool

    @contextmanager
    def connection(self) -> Iterator[Connection]:
        """A connection of the pool (autocommit), back in the pool afterwards."""
        pool = self._open_pool()
        with translated_errors(), pool.connection() as conn:
            yield conn

    def run(self, operation: Operation[T], conn: Connection | None = None) -> T:
        """Run one operation on ``conn`` (the caller's), else on a pool connection."""
        if conn is not None:
            return execute(conn, operation)
        attempt = 0
        while True:
            with self.connection() as own:
                try:
                    return execute(own, operation)
                except Exception as exc:
                    if not retryable(operation, exc, attempt):
                        raise
            attempt += 1

    def run_steps(self, steps: Steps[T], conn: Connection | None = None) -> T:
        """Run each operation the steps yield, sending back its result."""
        try:
            operation = next(steps)
            while True:
                result = self.run(operation, None if operation.detached else conn)
                operation = steps.send(result)
        except StopIteration as done:
            value: T = done.value
            return value
        finally:
            steps.close()

    def drive(self, plan: Plan) -> list[int]:
        """Run a statement plan (migrations) in one transaction."""
        with self.connection() as conn:
            return drive(conn, plan)

    def notified(self, statement: Statement) -> AbstractContextManager[Callable[[float], None]]:
        """``wait(seconds)``, cut short by a notification on what ``statement``
        LISTENs to (:mod:`.listening`)."""
        return notified(self.dsn, self._options, statement)

    def close(self) -> None:
        """Close the pool (a new one opens on the next use)."""
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.close()


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
    ) -> None:
        self.dsn = dsn
        self.open_timeout = open_timeout
        self._options = options or CONNECTION_OPTIONS
        self._settings = _pool_settings(dsn, min_size, max_size, options)
        #: The open pool; None until the first use, and again after a close.
        self._pool: AsyncConnectionPool | None = None
        self._lock = asyncio.Lock()
        self._failures = _OpenFailures()

    async def _open_pool(self) -> AsyncConnectionPool:
        pool = self._pool
        if pool is None:
            seen = self._failures.count
            async with self._lock:
                pool = self._pool
                if pool is None:
                    self._failures.raise_if_since(seen)
                    pool = AsyncConnectionPool(**self._settings)
                    try:
                        await pool.open(wait=True, timeout=self.open_timeout)
                        # The pool waits with asyncio.wait_for, which on Python 3.11
                        # returns when the first connection and a cancellation of
                        # this task arrive together: the cancellation must not be lost.
                        raise_if_cancelling()
                    except PoolTimeout:  # the pool closed itself
                        error = await aunreachable(self.dsn, self.open_timeout)
                        raise self._failures.record(error) from None
                    except BaseException:
                        await pool.close()
                        raise
                    self._pool = pool  # only once open: callers without the lock use it
        return pool

    @asynccontextmanager
    async def connection(self) -> AsyncIterator[AsyncConnection]:
        """A connection of the pool (autocommit), back in the pool afterwards."""
        pool = await self._open_pool()
        with translated_errors():
            async with pool.connection() as conn:
                yield conn

    async def run(self, operation: Operation[T], conn: AsyncConnection | None = None) -> T:
        """Run one operation on ``conn`` (the caller's), else on a pool connection."""
        if conn is not None:
            return await aexecute(conn, operation)
        attempt = 0
        while True:
            async with self.connection() as own:
                try:
                    return await aexecute(own, operation)
                except Exception as exc:
                    if not retryable(operation, exc, attempt):
                        raise
            attempt += 1

    async def run_steps(self, steps: Steps[T], conn: AsyncConnection | None = None) -> T:
        """Run each operation the steps yield, sending back its result."""
        try:
            operation = next(steps)
            while True:
                result = await self.run(operation, None if operation.detached else conn)
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
        LISTENs to (:mod:`.listening`)."""
        return anotified(self.dsn, self._options, statement)

    async def close(self) -> None:
        """Close the pool (a new one opens on the next use)."""
        async with self._lock:
            # Dropped before the wait: a close cancelled midway leaves no closed
            # pool behind for the next use.
            pool, self._pool = self._pool, None
        if pool is not None:
            await pool.close()

    # -- sessions outside the pool (asyncio only: the worker's) --------------------

    @asynccontextmanager
    async def session(self) -> AsyncIterator[Session]:
        """A connection of its own, outside the pool, for session state (an advisory
        lock held for as long as the session lives)."""
        with translated_errors():
            conn = await psycopg.AsyncConnection.connect(self.dsn, **self._options)
        async with conn:
            yield Session(conn)

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
