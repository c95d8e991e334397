"""Running leaseq's operations on a psycopg 3 connection, sync and async: one
operation's statements (in the caller's transaction if one is open), and the
statement plans of migrations. Driver errors come out as leaseq's (``errors``)."""

from __future__ import annotations

from typing import Any, TypeVar

import psycopg
from psycopg.postgres import types as postgres_types
from psycopg.rows import tuple_row
from psycopg.types.json import JsonbLoader, JsonLoader

from .._errors import DatabaseError, InvalidArgument
from .._statement import Operation, Plan, Rows, Statement
from .errors import translated_errors
from .placeholders import server_form

T = TypeVar("T")

Connection = psycopg.Connection[Any]
AsyncConnection = psycopg.AsyncConnection[Any]

#: How many times an operation is sent when it keeps hitting a SQLSTATE it
#: declares retryable (a race lost again and again means something is wrong).
RETRY_ATTEMPTS = 5


# Every cursor leaseq opens reads tuples, whatever row factory the caller's
# connection (``conn=``) was made with: a dict_row connection used to fail each
# decoder with KeyError 0.
#
# "Did it return rows?" from rownumber: `description` builds a Column object per
# column of the result, on every statement.
def _rows(cursor: psycopg.Cursor[Any]) -> Rows:
    return cursor.fetchall() if cursor.rownumber is not None else []


async def _arows(cursor: psycopg.AsyncCursor[Any]) -> Rows:
    return await cursor.fetchall() if cursor.rownumber is not None else []


def _args(statement: Statement) -> tuple[str, Any]:
    # Without parameters psycopg may send several statements in one string
    # (migrations need that); with an empty dict it would not.
    return statement.sql, (statement.params or None)


def callers(conn: Any, kind: type[Any]) -> Any:
    """The caller's connection (``conn=``), if it is one this client can use: a
    sync client takes a psycopg.Connection, an async one a psycopg.AsyncConnection.
    Checked before any step runs: the steps may write on leaseq's own connection
    first (a queue's settings row)."""
    if conn is not None and not isinstance(conn, kind):
        sync = kind is psycopg.Connection
        wanted, client = ("Connection", "Queue") if sync else ("AsyncConnection", "AsyncQueue")
        raise InvalidArgument(
            f"conn must be a psycopg.{wanted} for {client}, got {type(conn).__name__}"
        )
    if conn is not None and conn.closed and not conn.broken:
        # Closed by the caller's own code: no retry mends that (it was a
        # TransientError, "try again"). One the server ended (broken) is: a new
        # connection, the transaction again.
        raise InvalidArgument("conn is closed: pass an open connection (your transaction's)")
    if conn is not None and conn.info.pipeline_status != psycopg.pq.PipelineStatus.OFF:
        # Its results come at the pipeline's sync: leaseq reads each statement's
        # (an id, a fence's answer) before the next. It read none, failed with an
        # IndexError, and the job was written all the same.
        raise InvalidArgument(
            "conn is in pipeline mode: call leaseq outside the `conn.pipeline()` block"
        )
    return conn


def retryable(operation: Operation[Any], error: Exception, attempt: int) -> bool:
    # (a translated error: DatabaseError keeps the SQLSTATE the server sent; a
    # typed one, UniqueKeyHeld for LQ003 say, has the driver's error as its cause)
    if isinstance(error, DatabaseError):
        sqlstate = error.sqlstate
    else:
        sqlstate = getattr(error.__cause__, "sqlstate", None)
    return sqlstate in operation.retry_on and attempt + 1 < RETRY_ATTEMPTS


def execute(
    conn: Connection,
    operation: Operation[T],
    answered: list[Rows] | None = None,
    *,
    theirs: bool = False,
) -> T:
    """Run ``operation`` on ``conn``: in the caller's transaction if one is open,
    else in a transaction of its own when it has several statements. ``theirs``:
    ``conn`` is the caller's (``conn=``), whose loaders may not be leaseq's.

    ``answered`` receives the rows of a single statement that committed although
    an interruption (KeyboardInterrupt; CancelledError for :func:`aexecute`) cut
    the call short: the driver cancels the statement, but one that had committed
    already still answers, and the interruption is raised all the same."""
    with translated_errors():
        if operation.single:
            results = [_run(conn, operation.statements[0], answered, theirs)]
        else:
            with conn.transaction():
                results = [
                    _run(conn, statement, None, theirs) for statement in operation.statements
                ]
    return operation.decode(results)


async def aexecute(
    conn: AsyncConnection,
    operation: Operation[T],
    answered: list[Rows] | None = None,
    *,
    theirs: bool = False,
) -> T:
    """The async twin of :func:`execute`."""
    with translated_errors():
        if operation.single:
            results = [await _arun(conn, operation.statements[0], answered, theirs)]
        else:
            async with conn.transaction():
                results = [
                    await _arun(conn, statement, None, theirs) for statement in operation.statements
                ]
    return operation.decode(results)


def _committed_anyway(conn: psycopg.BaseConnection[Any], cursor: Any) -> bool:
    """Whether the statement an interruption cut short ran to its end all the same
    and committed: the driver cancelled it too late, it answered, and no transaction
    is open (autocommit) to roll it back."""
    result = cursor.pgresult
    return (
        result is not None
        and result.status == psycopg.pq.ExecStatus.TUPLES_OK
        and conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    )


#: json and jsonb as leaseq decodes them (Python values), by type oid.
_JSON_LOADERS = (
    (postgres_types["json"].oid, JsonLoader),
    (postgres_types["jsonb"].oid, JsonbLoader),
)


def _json_as_values(cursor: psycopg.Cursor[Any] | psycopg.AsyncCursor[Any]) -> None:
    """Have ``cursor`` load json and jsonb as Python values, whatever the caller's
    connection (``conn=``) loads them as: Django's loads jsonb as text (for its
    JSONField), and a job read on it in the caller's transaction came back with
    its payload a string. Only the cursor changes; the connection's own loaders
    (a subclass from ``set_json_loads(..., conn)`` included) are kept."""
    for oid, loader in _JSON_LOADERS:
        found = cursor.adapters.get_loader(oid, psycopg.pq.Format.TEXT)
        if found is None or not issubclass(found, loader):
            cursor.adapters.register_loader(oid, loader)


def _run(conn: Connection, statement: Statement, answered: list[Rows] | None, theirs: bool) -> Rows:
    form = server_form(statement.sql) if statement.params else None
    cursor: psycopg.Cursor[Any] = (
        conn.cursor(row_factory=tuple_row)
        if form is None
        else psycopg.RawCursor(conn, row_factory=tuple_row)
    )
    if theirs:  # leaseq's own connections load json as values already
        _json_as_values(cursor)
    with cursor:
        try:
            if form is None:
                cursor.execute(*_args(statement))
            else:
                cursor.execute(form.sql, form.values(statement.params))
        except Exception:
            raise
        except BaseException:  # interrupted: see execute()
            if answered is not None and _committed_anyway(conn, cursor):
                answered.append(cursor.fetchall())
            raise
        return _rows(cursor)


async def _arun(
    conn: AsyncConnection, statement: Statement, answered: list[Rows] | None, theirs: bool
) -> Rows:
    form = server_form(statement.sql) if statement.params else None
    cursor: psycopg.AsyncCursor[Any] = (
        conn.cursor(row_factory=tuple_row)
        if form is None
        else psycopg.AsyncRawCursor(conn, row_factory=tuple_row)
    )
    if theirs:  # leaseq's own connections load json as values already
        _json_as_values(cursor)
    async with cursor:
        try:
            if form is None:
                await cursor.execute(*_args(statement))
            else:
                await cursor.execute(form.sql, form.values(statement.params))
        except Exception:
            raise
        except BaseException:  # cancelled: see execute()
            if answered is not None and _committed_anyway(conn, cursor):
                answered.append(await cursor.fetchall())  # (rows in memory: no wait)
            raise
        return await _arows(cursor)


def drive(conn: Connection, plan: Plan) -> list[int]:
    """Run a statement-yielding plan (migrations) in one transaction."""
    with (
        translated_errors(migrating=True),
        conn.transaction(),
        conn.cursor(row_factory=tuple_row) as cursor,
    ):
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
    with translated_errors(migrating=True):
        async with conn.transaction(), conn.cursor(row_factory=tuple_row) as cursor:
            try:
                statement = next(plan)
                while True:
                    await cursor.execute(*_args(statement))
                    statement = plan.send(await _arows(cursor))
            except StopIteration as stop:
                result: list[int] = stop.value
                return result
