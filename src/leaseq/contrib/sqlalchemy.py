"""leaseq inside SQLAlchemy transactions (``pip install leaseq[sqlalchemy]``).

Two things, on the ``postgresql+psycopg`` dialect (psycopg 3, sync or async):

* **Enqueue with your ORM writes**: :func:`psycopg_connection` (and
  :func:`apsycopg_connection`) give the psycopg connection under a ``Session`` or
  ``Connection``, inside its current transaction, for leaseq's ``conn=``::

      with Session(engine) as session, session.begin():
          session.add(Report(customer="acme"))
          queue.enqueue("reports", {"customer": "acme"}, conn=psycopg_connection(session))

  The job commits or rolls back with the session's transaction.

* **A handler's effect and its completion in one transaction**: :func:`job_session`
  (and :func:`job_async_session`) open a session, yield it, then complete the job
  inside the session's transaction and commit both together::

      with job_session(job, engine) as session:
          session.add(Report(key=job.idempotency_key, body=body))

This module writes no SQL of its own: the fence, the completion and the enqueue
are leaseq's (``JobContext.complete_in``, ``Queue.enqueue(conn=...)``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any, NoReturn

import psycopg
from psycopg.pq import TransactionStatus
from sqlalchemy import Connection, Engine, RootTransaction, event, null, select
from sqlalchemy.engine.interfaces import Dialect
from sqlalchemy.ext.asyncio import (
    AsyncConnection,
    AsyncEngine,
    AsyncSession,
    AsyncSessionTransaction,
    async_scoped_session,
    async_sessionmaker,
)
from sqlalchemy.orm import Session, SessionTransaction, scoped_session, sessionmaker

from leaseq import InvalidArgument, JobContext, LeaseLost

__all__ = [
    "apsycopg_connection",
    "job_async_session",
    "job_session",
    "psycopg_connection",
]

#: What a handler's session is made from: an engine, or your configured factory.
SessionBind = Engine | sessionmaker[Session]
AsyncSessionBind = AsyncEngine | async_sessionmaker[AsyncSession]


# -- the psycopg connection under a session ---------------------------------------


def psycopg_connection(
    session_or_connection: Session | scoped_session[Session] | Connection,
) -> psycopg.Connection[Any]:
    """The psycopg connection under a ``Session`` (a ``scoped_session``'s current
    one included) or a Core ``Connection``, inside its current transaction, for
    leaseq's ``conn=`` (``enqueue``, ``complete``...).

    A transaction is begun if none is (as SQLAlchemy's autobegin would), so what
    leaseq writes on the connection commits or rolls back with that transaction:
    ``session.commit()``, ``connection.commit()``, or the ``begin()`` block.
    Pending ORM objects are not flushed: call ``session.flush()`` first when the
    payload needs their generated keys.

    Raises InvalidArgument, before anything is written, when the dialect is not
    ``postgresql+psycopg`` (psycopg2, asyncpg, sqlite...), when the session or
    connection is async (use :func:`apsycopg_connection`), or when the connection
    is in autocommit (``isolation_level="AUTOCOMMIT"``: nothing would commit
    together).
    """
    connection = _sync_connection(session_or_connection)
    driver = connection.connection.driver_connection
    if not isinstance(driver, psycopg.Connection):
        raise InvalidArgument(f"expected a psycopg 3 connection, got {type(driver).__name__}")
    _refuse_autocommit(driver.autocommit)
    if driver.info.transaction_status == TransactionStatus.IDLE:
        # Open the transaction on the server through SQLAlchemy, so that both
        # agree one is open: without it a bare Connection would not know it has
        # one to commit, and a psycopg transaction block leaseq opened on an idle
        # connection would commit on its own.
        connection.execute(select(null()))
    return driver


async def apsycopg_connection(
    session_or_connection: AsyncSession | async_scoped_session[AsyncSession] | AsyncConnection,
) -> psycopg.AsyncConnection[Any]:
    """The async twin of :func:`psycopg_connection`, for an ``AsyncSession`` (an
    ``async_scoped_session``'s current one included) or an ``AsyncConnection`` on
    ``postgresql+psycopg`` (``create_async_engine``)."""
    connection = await _async_connection(session_or_connection)
    raw = await connection.get_raw_connection()
    driver = raw.driver_connection
    if not isinstance(driver, psycopg.AsyncConnection):
        raise InvalidArgument(f"expected a psycopg 3 connection, got {type(driver).__name__}")
    _refuse_autocommit(driver.autocommit)
    if driver.info.transaction_status == TransactionStatus.IDLE:
        # As in psycopg_connection: SQLAlchemy and the server agree on the transaction.
        await connection.execute(select(null()))
    return driver


def _sync_connection(
    session_or_connection: Session | scoped_session[Session] | Connection,
) -> Connection:
    """The SQLAlchemy connection (in the session's transaction), checked first."""
    if isinstance(session_or_connection, scoped_session):
        # (Flask-SQLAlchemy's db.session): the session of the current scope
        session_or_connection = session_or_connection()
    if isinstance(session_or_connection, AsyncSession | AsyncConnection | async_scoped_session):
        raise InvalidArgument("an async session or connection: use apsycopg_connection")
    if isinstance(session_or_connection, Session):
        # The dialect is checked on the bind, before a connection is checked out.
        _require_psycopg(session_or_connection.get_bind().dialect)
        return session_or_connection.connection()
    if isinstance(session_or_connection, Connection):
        _require_psycopg(session_or_connection.dialect)
        return session_or_connection
    raise InvalidArgument(
        f"expected a SQLAlchemy Session or Connection, got {type(session_or_connection).__name__}"
    )


async def _async_connection(
    session_or_connection: AsyncSession | async_scoped_session[AsyncSession] | AsyncConnection,
) -> AsyncConnection:
    """The async twin of :func:`_sync_connection`."""
    if isinstance(session_or_connection, async_scoped_session):
        session_or_connection = session_or_connection()
    if isinstance(session_or_connection, AsyncSession):
        _require_psycopg(session_or_connection.sync_session.get_bind().dialect)
        return await session_or_connection.connection()
    if isinstance(session_or_connection, AsyncConnection):
        _require_psycopg(session_or_connection.dialect)
        return session_or_connection
    raise InvalidArgument(
        "expected a SQLAlchemy AsyncSession or AsyncConnection, got "
        f"{type(session_or_connection).__name__} (for a sync one: psycopg_connection)"
    )


def _require_psycopg(dialect: Dialect) -> None:
    if (dialect.name, dialect.driver) != ("postgresql", "psycopg"):
        raise InvalidArgument(
            f"leaseq needs the postgresql+psycopg dialect (psycopg 3), "
            f"not {dialect.name}+{dialect.driver}: create the engine from "
            "'postgresql+psycopg://...'"
        )


def _refuse_autocommit(autocommit: bool) -> None:
    if autocommit:
        raise InvalidArgument(
            "the connection is in autocommit: leaseq's writes would commit on their "
            "own, not with your transaction"
        )


# -- a handler's effect and its completion, in one session transaction ------------


@contextmanager
def job_session(job: JobContext, bind: SessionBind) -> Iterator[Session]:
    """A session whose transaction holds the handler's effect and the job's completion.

    ``bind`` is an ``Engine`` (the session then has ``expire_on_commit=False``:
    it is closed right after the commit, and the objects stay readable) or your
    ``sessionmaker`` (its settings hold). Write the effect on the yielded session
    and set ``job.result`` inside the block if the job has one. On leaving the
    block the session is flushed, the job is completed in the same transaction
    (fenced: LeaseLost if this attempt no longer owns the job, AlreadyCompleted
    on a re-run), and it commits; then the worker is told the job is done.

    Any exception inside the block, LeaseLost included, rolls back the effect and
    the completion together, and propagates (the worker retries the job as it
    would for the handler's own exception). Do not commit or roll back the
    session yourself inside the block (InvalidArgument); ``begin_nested()``
    savepoints are fine. Use it in ``def`` handlers; in ``async def`` ones,
    :func:`job_async_session`.
    """
    _refuse_when_lost(job)
    with job._completing_block(), _new_session(bind) as session:
        _refuse_joined(session)
        transaction = session.begin()
        _refuse_commits(session)
        connection = session.connection()
        begun = connection.get_transaction()  # the block's, on the session's connection
        with _connection_commits_refused(connection) as ours:
            try:
                # Checked before the block runs: on an engine in autocommit each of
                # its writes would commit on its own, and a refusal at the end came
                # too late (the effect committed, the job not completed).
                driver = psycopg_connection(session)
                # Before the effect (REPEATABLE READ, SERIALIZABLE): JobContext._hold_in.
                job._hold_in(driver)
                yield session
                _require_open(transaction, connection, begun)
                session.flush()  # the effect's writes first: a failing one raises first
                job.completing = True  # the fence decides from here (JobContext)
                job.complete_in(driver)
                ours.append(True)  # the one commit that is the block's
                transaction.commit()
            except BaseException:
                if transaction.is_active:
                    transaction.rollback()
                stray = _stray_transaction(connection, begun)
                if stray is not None:
                    stray.rollback()
                raise
            finally:
                job.completing = False
    job.mark_completed()


@asynccontextmanager
async def job_async_session(job: JobContext, bind: AsyncSessionBind) -> AsyncIterator[AsyncSession]:
    """The async twin of :func:`job_session`, for ``async def`` handlers: ``bind``
    is an ``AsyncEngine`` or an ``async_sessionmaker`` on ``postgresql+psycopg``.

    The engine's pool belongs to the event loop that first used it: create it in
    the process that runs the worker and use it only from the worker's handlers
    there (one loop per worker process), never from another loop or thread.
    """
    _refuse_when_lost(job)
    with job._completing_block():
        async with _new_async_session(bind) as session:
            _refuse_joined(session.sync_session)
            transaction = session.begin()
            await transaction.start()
            _refuse_commits(session)
            connection = await session.connection()
            sync = connection.sync_connection
            begun = None if sync is None else sync.get_transaction()
            with _connection_commits_refused(sync) as ours:
                try:
                    driver = await apsycopg_connection(session)  # as job_session's
                    await job._ahold_in(driver)
                    yield session
                    _require_open(transaction, sync, begun)
                    await session.flush()
                    job.completing = True  # the fence decides from here (JobContext)
                    await job.acomplete_in(driver)
                    ours.append(True)  # the one commit that is the block's
                    await transaction.commit()
                except BaseException:
                    if transaction.is_active:
                        await transaction.rollback()
                    if _stray_transaction(sync, begun) is not None:
                        await connection.rollback()
                    raise
                finally:
                    job.completing = False
    job.mark_completed()


def _new_session(bind: SessionBind) -> Session:
    if isinstance(bind, Engine):
        return Session(bind, expire_on_commit=False)
    if isinstance(bind, sessionmaker):
        return bind()
    raise InvalidArgument(f"expected an Engine or a sessionmaker, got {type(bind).__name__}")


def _new_async_session(bind: AsyncSessionBind) -> AsyncSession:
    if isinstance(bind, AsyncEngine):
        return AsyncSession(bind, expire_on_commit=False)
    if isinstance(bind, async_sessionmaker):
        return bind()
    raise InvalidArgument(
        f"expected an AsyncEngine or an async_sessionmaker, got {type(bind).__name__}"
    )


def _refuse_when_lost(job: JobContext) -> None:
    """Fail before opening anything when this attempt already lost its lease
    (the completion would refuse anyway, after the effect's work)."""
    if job.lost.is_set():
        raise LeaseLost(job.job_id, job.lease_version, "transaction")


def _refuse_joined(session: Session) -> None:
    """A session bound to a Connection whose transaction is already open (SQLAlchemy's
    "join a session into an external transaction") leaves that transaction to its
    owner, unless it is told to take it over (``join_transaction_mode=
    "control_fully"``): its commit is a savepoint's release, or nothing. The block's
    effect and completion would then wait for the caller's commit, or roll back
    with it, while the job was already reported completed. Refused before anything
    is written."""
    bind = session.bind
    if (
        isinstance(bind, Connection)
        and bind.in_transaction()
        and session.join_transaction_mode != "control_fully"
    ):
        raise InvalidArgument(
            "the session is bound to a Connection whose transaction is already open: "
            "its commit would not commit the job's completion with the effect (bind "
            "job_session to an Engine, or a sessionmaker of one, or to a Connection "
            "with no transaction begun)"
        )


def _refuse_commits(session: Session | AsyncSession) -> None:
    """The session's own ``commit()`` and ``rollback()`` raise for the rest of its
    life (the block's), at the call: a commit would commit the effect alone,
    before anything is sent; a rollback would end the block's transaction, and
    what the handler wrote next would go outside the job's. (job_session commits
    or rolls back the block's transaction itself, not through them;
    ``begin_nested()`` savepoints have their own.)"""

    def refuse_commit(*args: Any, **kwargs: Any) -> NoReturn:
        raise InvalidArgument(
            "a commit inside the job_session block would commit the effect without the "
            "job's completion: leaving the block commits both (begin_nested() "
            "savepoints are fine)"
        )

    def refuse_rollback(*args: Any, **kwargs: Any) -> NoReturn:
        raise InvalidArgument(
            "a rollback inside the job_session block would end the job's transaction: "
            "raise instead, and the block rolls back the effect (begin_nested() "
            "savepoints are fine)"
        )

    # This session only, not its class.
    session.__dict__["commit"] = refuse_commit
    session.__dict__["rollback"] = refuse_rollback


@contextmanager
def _connection_commits_refused(connection: Connection | None) -> Iterator[list[bool]]:
    """The session's connection refuses a commit too, for the block
    (``session.connection().commit()``): one would commit the effect alone, and
    each retry again. A Connection takes no attributes of its own, so through its
    ``commit`` event, which runs before the commit is sent; the block's own commit
    is let through once the yielded list holds True. The listener leaves with the
    block: the connection may be the caller's own (a sessionmaker bound to it)."""
    allowed: list[bool] = []

    def refuse(conn: Connection) -> None:
        if not allowed:
            raise InvalidArgument(
                "a commit inside the job_session block would commit the effect without "
                "the job's completion: leaving the block commits both (begin_nested() "
                "savepoints are fine)"
            )

    if connection is None:  # (an async session's, before it has one: cannot be)
        yield allowed
        return
    event.listen(connection, "commit", refuse)
    try:
        yield allowed
    finally:
        event.remove(connection, "commit", refuse)


def _require_open(
    transaction: SessionTransaction | AsyncSessionTransaction,
    connection: Connection | None,
    begun: RootTransaction | None,
) -> None:
    """The effect and the completion must share the block's transaction: a commit
    or rollback inside the block would split them. That includes a rollback of
    the session's connection (``session.connection().rollback()``), which the
    session does not see: what the handler wrote next, and the completion, went
    into a new transaction on that connection, which the session's commit would
    not commit (the job then marked completed, its completion rolled back)."""
    if not transaction.is_active or (
        connection is not None
        and (begun is None or not begun.is_active or connection.get_transaction() is not begun)
    ):
        raise InvalidArgument(
            "the session's transaction ended inside the job_session block: "
            "job_session commits (with the completion) or rolls back itself"
        )


def _stray_transaction(
    connection: Connection | None, begun: RootTransaction | None
) -> RootTransaction | None:
    """A transaction the session's connection began inside the block after the
    block's own ended (see :func:`_require_open`): it holds writes of the block,
    and must roll back with it (on a caller's own connection, whose transaction
    the session would otherwise leave open for the caller's next commit)."""
    if connection is None:
        return None
    current = connection.get_transaction()
    return current if current is not None and current is not begun else None
