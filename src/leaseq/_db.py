"""The only module that talks to the driver: pools, execution, error mapping.

``_store`` builds :class:`~leaseq._statement.Operation` values (and steps of
them); this module runs them on psycopg 3 connections, sync or async, and turns
the driver's errors into leaseq's typed errors, so that nothing above it needs
to know psycopg's exception classes: errors that say "try again later" become
:class:`TransientError`, those that mean something to users their own types.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager, suppress
from typing import Any, TypeVar

import psycopg
from psycopg_pool import AsyncConnectionPool, ConnectionPool, PoolTimeout

from ._errors import (
    BacklogFull,
    DatabaseUnavailable,
    InvalidArgument,
    NotMigrated,
    PayloadTooLarge,
    StatementTimeout,
    TransientError,
)
from ._redact import redact
from ._statement import Operation, Plan, Rows, Statement, Steps
from ._validate import sanitize

T = TypeVar("T")

Connection = psycopg.Connection[Any]
AsyncConnection = psycopg.AsyncConnection[Any]

#: Sent with every connection leaseq opens; keepalives notice a dead peer.
CONNECTION_OPTIONS: dict[str, Any] = {
    "autocommit": True,
    "application_name": "leaseq",
    "keepalives": 1,
    "keepalives_idle": 10,
    "keepalives_interval": 5,
    "keepalives_count": 3,
}

#: Added for worker sessions: a dead server is noticed within ~30 s even while a
#: write is unacknowledged, and no session idles in a transaction for long.
WORKER_OPTIONS: dict[str, Any] = {
    **CONNECTION_OPTIONS,
    "tcp_user_timeout": 30_000,
    "options": "-c idle_in_transaction_session_timeout=60000",
}


def with_statement_timeout(options: dict[str, Any] | None, seconds: float) -> dict[str, Any]:
    """Connection settings under which the server cancels any statement running
    longer than ``seconds`` (SQLSTATE 57014, raised as StatementTimeout)."""
    settings = dict(options or CONNECTION_OPTIONS)
    given = settings.get("options", "")
    milliseconds = max(1, round(seconds * 1000))
    settings["options"] = f"{given} -c statement_timeout={milliseconds}".strip()
    return settings


_ERRORS_BY_SQLSTATE: dict[str, type[Exception]] = {
    "57014": StatementTimeout,  # query_canceled: statement_timeout (or pg_cancel_backend)
    "LQ001": BacklogFull,
    "LQ002": PayloadTooLarge,
    "3F000": NotMigrated,  # invalid_schema_name
    "42P01": NotMigrated,  # undefined_table
    "42883": NotMigrated,  # undefined_function
    "42703": NotMigrated,  # undefined_column (a schema older than the code: 0003's settings)
    "23514": InvalidArgument,  # check_violation
    "22003": InvalidArgument,  # numeric_value_out_of_range
    "22008": InvalidArgument,  # datetime_field_overflow
}

#: Plain words for the check constraints that input validation cannot see coming
#: (they compare a given setting with a stored one), by constraint name.
_CONSTRAINT_MESSAGES = {
    "queue_check": "backoff_cap must be >= backoff_base (the queue's stored value "
    "counts for the one not given)",
}

#: How many times an operation is sent when it keeps hitting a SQLSTATE it
#: declares retryable (a race lost again and again means something is wrong).
RETRY_ATTEMPTS = 5


@contextmanager
def translated_errors() -> Iterator[None]:
    """Driver errors as leaseq's typed errors, every text scrubbed of secrets.

    OperationalError (a lost or refused connection, a deadlock, a serialization
    failure, a cancelled statement), a pool timeout and a socket error become
    TransientError; the SQLSTATEs of _ERRORS_BY_SQLSTATE their leaseq types;
    other driver errors pass through (their SQLSTATE still says what they are).
    """
    try:
        yield
    except psycopg.Error as exc:
        _scrub(exc)
        _raise_if_cancelling(exc)
        kind = _ERRORS_BY_SQLSTATE.get(exc.sqlstate or "")
        if kind is None and isinstance(exc, psycopg.OperationalError):
            kind = TransientError
        if kind is None:
            raise
        message = _CONSTRAINT_MESSAGES.get(exc.diag.constraint_name or "") or redact(
            exc.diag.message_primary or str(exc).strip() or type(exc).__name__
        )
        if kind is NotMigrated:
            message = f"{message} (has the leaseq schema been migrated? run `leaseq migrate`)"
        raise kind(message) from exc
    except PoolTimeout as exc:
        raise DatabaseUnavailable(redact(f"no database connection in time: {exc}")) from exc
    except OSError as exc:
        _raise_if_cancelling(exc)
        raise TransientError(redact(f"{type(exc).__name__}: {exc}")) from exc


def _raise_if_cancelling(error: BaseException) -> None:
    """A query interrupted by the cancellation of its asyncio task can come out of
    the driver as a connection error ("query cancellation interrupted: closing
    connection"). Raised as TransientError it would be taken for "try again", and
    a loop that retries would never see its own cancellation: so the task's
    pending cancellation is raised instead."""
    try:
        task = asyncio.current_task()
    except RuntimeError:  # no running loop: a sync caller
        return
    if task is not None and task.cancelling():
        raise asyncio.CancelledError from error


def _scrub(error: BaseException) -> None:
    """Redact the texts of ``error`` and of the errors chained to it, in place:
    libpq may quote a DSN's password in them."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        with suppress(Exception):  # an odd exception must not hide the one being raised
            current.args = tuple(redact(a) if isinstance(a, str) else a for a in current.args)
        current = current.__cause__ or current.__context__


def _rows(cursor: psycopg.Cursor[Any]) -> Rows:
    return cursor.fetchall() if cursor.description is not None else []


async def _arows(cursor: psycopg.AsyncCursor[Any]) -> Rows:
    return await cursor.fetchall() if cursor.description is not None else []


def _args(statement: Statement) -> tuple[str, Any]:
    # Without parameters psycopg may send several statements in one string
    # (migrations need that); with an empty dict it would not.
    return statement.sql, (statement.params or None)


def _retryable(operation: Operation[Any], error: Exception, attempt: int) -> bool:
    sqlstate = error.sqlstate if isinstance(error, psycopg.Error) else None
    return sqlstate in operation.retry_on and attempt + 1 < RETRY_ATTEMPTS


def execute(conn: Connection, operation: Operation[T]) -> T:
    """Run ``operation`` on ``conn``: in the caller's transaction if one is open,
    else in a transaction of its own when it has several statements."""
    with translated_errors():
        results: list[Rows] = []
        with conn.cursor() as cursor:
            if operation.single:
                cursor.execute(*_args(operation.statements[0]))
                results.append(_rows(cursor))
            else:
                with conn.transaction():
                    for statement in operation.statements:
                        cursor.execute(*_args(statement))
                        results.append(_rows(cursor))
    return operation.decode(results)


async def aexecute(conn: AsyncConnection, operation: Operation[T]) -> T:
    """The async twin of :func:`execute`."""
    with translated_errors():
        results: list[Rows] = []
        async with conn.cursor() as cursor:
            if operation.single:
                await cursor.execute(*_args(operation.statements[0]))
                results.append(await _arows(cursor))
            else:
                async with conn.transaction():
                    for statement in operation.statements:
                        await cursor.execute(*_args(statement))
                        results.append(await _arows(cursor))
    return operation.decode(results)


def drive(conn: Connection, plan: Plan) -> list[int]:
    """Run a statement-yielding plan (migrations) in one transaction."""
    with translated_errors(), conn.transaction(), conn.cursor() as cursor:
        try:
            statement = next(plan)
            while True:
                cursor.execute(*_args(statement))
                statement = plan.send(_rows(cursor))
        except StopIteration as stop:
            result: list[int] = stop.value
            return result


async def adrive(conn: AsyncConnection, plan: Plan) -> list[int]:
    """The async twin of :func:`drive`."""
    with translated_errors():
        async with conn.transaction(), conn.cursor() as cursor:
            try:
                statement = next(plan)
                while True:
                    await cursor.execute(*_args(statement))
                    statement = plan.send(await _arows(cursor))
            except StopIteration as stop:
                result: list[int] = stop.value
                return result


def _unreachable(dsn: str) -> DatabaseUnavailable:
    """Why the pool could not open: one direct attempt tells the real reason.

    The reason is scrubbed (sanitize): libpq may quote the DSN's password in it.
    """
    try:
        psycopg.connect(dsn, connect_timeout=5, **CONNECTION_OPTIONS).close()
    except psycopg.Error as exc:
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return DatabaseUnavailable(f"cannot connect to the database: {sanitize(reason)}")
    return DatabaseUnavailable("cannot connect to the database: timed out")


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


class Database:
    """A lazily opened pool of autocommit connections (sync)."""

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
        self._pool = ConnectionPool(**_pool_settings(dsn, min_size, max_size, options))
        self._opened = False
        self._lock = threading.Lock()

    def _ensure_open(self) -> None:
        if not self._opened:
            with self._lock:
                if not self._opened:
                    # The pool stays open on a timeout and keeps trying in the background.
                    self._opened = True
                    try:
                        self._pool.open(wait=True, timeout=self.open_timeout)
                    except PoolTimeout:
                        raise _unreachable(self.dsn) from None

    @contextmanager
    def connection(self) -> Iterator[Connection]:
        """A connection of the pool (autocommit), back in the pool afterwards."""
        self._ensure_open()
        with translated_errors(), self._pool.connection() as conn:
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
                    if not _retryable(operation, exc, attempt):
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

    def close(self) -> None:
        """Close the pool (it opens again on the next use)."""
        if self._opened:
            self._pool.close()
            self._opened = False


class AsyncDatabase:
    """A lazily opened pool of autocommit connections (asyncio)."""

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
        self._pool = AsyncConnectionPool(**_pool_settings(dsn, min_size, max_size, options))
        self._opened = False
        self._lock = asyncio.Lock()

    async def _ensure_open(self) -> None:
        if not self._opened:
            async with self._lock:
                if not self._opened:
                    # The pool stays open on a timeout and keeps trying in the background.
                    self._opened = True
                    try:
                        await self._pool.open(wait=True, timeout=self.open_timeout)
                    except PoolTimeout:
                        raise _unreachable(self.dsn) from None

    @asynccontextmanager
    async def connection(self) -> AsyncIterator[AsyncConnection]:
        """A connection of the pool (autocommit), back in the pool afterwards."""
        await self._ensure_open()
        with translated_errors():
            async with self._pool.connection() as conn:
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
                    if not _retryable(operation, exc, attempt):
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

    async def close(self) -> None:
        """Close the pool (it opens again on the next use)."""
        if self._opened:
            await self._pool.close()
            self._opened = False

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
