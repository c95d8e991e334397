"""SQLAlchemy's job_session blocks: a rollback of the session's connection inside
the block completes nothing (nor leaves anything for a caller's next commit), a
block that completes the job inside another is refused, and a scoped session
(Flask-SQLAlchemy's db.session) is taken as its current session."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.ext.asyncio import AsyncEngine

import leaseq
from leaseq import JobStatus
from leaseq.contrib.sqlalchemy import job_async_session, job_session

# The SQLAlchemy tests' own fixtures (imported: pytest finds them here).
from .test_contrib_sqlalchemy import (  # noqa: F401
    Counts,
    _claimed,
    _effect,
    async_engine,
    counts,
    engine,
)

# -- job_session: a rollback of the session's connection ------------------------------


def test_a_rollback_of_the_sessions_connection_inside_the_block_completes_nothing(
    engine: Engine,  # noqa: F811
    queue: leaseq.Queue,
    aqueue: leaseq.AsyncQueue,
    counts: Counts,  # noqa: F811
) -> None:
    """``session.connection().rollback()`` inside the block ended the block's
    transaction behind the session's back: what the handler wrote next went into a
    new transaction, with the completion, which the session's commit did not commit
    (closing the connection rolled it back). The block still returned normally and
    marked the job completed: the worker counted it done and stopped renewing a
    lease whose job was still running, with no effect."""
    job = _claimed(queue, aqueue)
    with (
        pytest.raises(leaseq.InvalidArgument, match="job_session block"),
        job_session(job, engine) as session,
    ):
        _effect(session, job)
        session.flush()
        session.connection().rollback()
        _effect(session, job)
        session.flush()  # the handler goes on writing
    assert not job.completed
    assert queue.get(job.job_id).status is JobStatus.RUNNING
    assert counts.reports() == 0


async def test_a_rollback_of_the_async_sessions_connection_inside_the_block_completes_nothing(
    async_engine: AsyncEngine,  # noqa: F811
    queue: leaseq.Queue,
    aqueue: leaseq.AsyncQueue,
    counts: Counts,  # noqa: F811
) -> None:
    job = _claimed(queue, aqueue)
    with pytest.raises(leaseq.InvalidArgument, match="job_session block"):
        async with job_async_session(job, async_engine) as session:
            _effect(session, job)
            await session.flush()
            await (await session.connection()).rollback()
            _effect(session, job)
            await session.flush()
    assert not job.completed
    assert queue.get(job.job_id).status is JobStatus.RUNNING
    assert counts.reports() == 0


def test_a_rollback_of_a_callers_own_connection_leaves_nothing_to_commit_later(
    engine: Engine,  # noqa: F811
    queue: leaseq.Queue,
    aqueue: leaseq.AsyncQueue,
    counts: Counts,  # noqa: F811
) -> None:
    """A sessionmaker bound to the caller's own Connection (SQLAlchemy's "join a
    session into an external transaction"). After ``session.connection().rollback()``
    the handler's next writes, and the completion, went into a new transaction of
    that connection; the block then raised (SQLAlchemy's "This transaction is
    inactive", at its commit) but left that transaction open: the caller's next
    commit committed the effect and the completion of a block that had failed, a
    job done behind its worker's back (which retried it, and counted a lost lease)."""
    from sqlalchemy.orm import sessionmaker

    job = _claimed(queue, aqueue)
    with engine.connect() as conn:
        with (
            pytest.raises(Exception) as raised,  # noqa: PT011 - its type is asserted below
            job_session(job, sessionmaker(bind=conn)) as session,
        ):
            _effect(session, job)
            session.flush()
            session.connection().rollback()
            _effect(session, job)
            session.flush()
        conn.commit()  # the caller's own work afterwards
    assert counts.reports() == 0  # nothing of a block that raised commits later
    assert queue.get(job.job_id).status is JobStatus.RUNNING
    assert not job.completed
    assert isinstance(raised.value, leaseq.InvalidArgument), raised.value


# -- nested blocks: the inner one completes the job, the outer one's effect is lost ----


def _other_effect(conn: Any, schema: str, job: leaseq.JobContext) -> None:
    conn.execute(
        f'INSERT INTO "{schema}".report (key, customer) VALUES (%s, %s)',
        (job.idempotency_key, "inner"),
    )


def test_a_job_transaction_inside_a_job_session_block_is_refused(
    engine: Engine,  # noqa: F811
    queue: leaseq.Queue,
    aqueue: leaseq.AsyncQueue,
    counts: Counts,  # noqa: F811
) -> None:
    """README: "A job.transaction() inside another raises InvalidArgument" (the inner
    one would complete the job on its own, and the outer one's completion then be
    refused, rolling its writes back). Inside a job_session block it was not
    refused: the inner block committed its effect and the job's completion, the
    outer block's effect rolled back with AlreadyCompleted, a LeaseLost the
    worker takes for a done job: the job ended done, with half its effect."""
    job = _claimed(queue, aqueue)
    with (
        pytest.raises(leaseq.InvalidArgument, match="already open"),
        job_session(job, engine) as session,
    ):
        _effect(session, job)
        with job.transaction() as conn:
            _other_effect(conn, queue.schema, job)
    assert not job.completed
    assert queue.get(job.job_id).status is JobStatus.RUNNING
    assert counts.reports() == 0


def test_a_job_session_inside_a_job_transaction_is_refused(
    engine: Engine,  # noqa: F811
    queue: leaseq.Queue,
    aqueue: leaseq.AsyncQueue,
    counts: Counts,  # noqa: F811
) -> None:
    job = _claimed(queue, aqueue)
    with (
        pytest.raises(leaseq.InvalidArgument, match="already open"),
        job.transaction() as conn,
    ):
        _other_effect(conn, queue.schema, job)
        with job_session(job, engine) as session:
            _effect(session, job)
    assert not job.completed
    assert queue.get(job.job_id).status is JobStatus.RUNNING
    assert counts.reports() == 0


async def test_a_job_async_session_inside_a_job_atransaction_is_refused(
    async_engine: AsyncEngine,  # noqa: F811
    queue: leaseq.Queue,
    aqueue: leaseq.AsyncQueue,
    counts: Counts,  # noqa: F811
) -> None:
    job = _claimed(queue, aqueue)
    with pytest.raises(leaseq.InvalidArgument, match="already open"):
        async with job.atransaction() as conn:
            await conn.execute(
                f'INSERT INTO "{queue.schema}".report (key, customer) VALUES (%s, %s)',
                (job.idempotency_key, "inner"),
            )
            async with job_async_session(job, async_engine) as session:
                _effect(session, job)
    assert not job.completed
    assert queue.get(job.job_id).status is JobStatus.RUNNING
    assert counts.reports() == 0


def test_a_job_session_inside_a_job_session_is_refused(
    engine: Engine,  # noqa: F811
    queue: leaseq.Queue,
    aqueue: leaseq.AsyncQueue,
    counts: Counts,  # noqa: F811
) -> None:
    job = _claimed(queue, aqueue)
    with (
        pytest.raises(leaseq.InvalidArgument, match="already open"),
        job_session(job, engine) as outer,
    ):
        _effect(outer, job)
        with job_session(job, engine) as inner:
            inner.execute(
                text(f'INSERT INTO "{queue.schema}".report (key, customer) VALUES (:k, :c)'),
                {"k": job.idempotency_key, "c": "inner"},
            )
    assert not job.completed
    assert queue.get(job.job_id).status is JobStatus.RUNNING
    assert counts.reports() == 0


# -- psycopg_connection: the scoped session the docs name ----------------------------


def test_psycopg_connection_takes_a_scoped_session(
    engine: Engine,  # noqa: F811
    queue: leaseq.Queue,
    aqueue: leaseq.AsyncQueue,
    counts: Counts,  # noqa: F811
) -> None:
    """docs/sqlalchemy.md, "Without the helpers": "for a framework that manages its
    own session (a request-scoped session, ``scoped_session``), do the same by hand"
    with ``psycopg_connection(session)``. Given a ``scoped_session`` (Flask-SQLAlchemy's
    ``db.session`` is one) it raised InvalidArgument ("expected a SQLAlchemy Session
    or Connection, got scoped_session"): neither the recipe nor a transactional
    enqueue worked with it."""
    from sqlalchemy.orm import scoped_session, sessionmaker

    from leaseq.contrib.sqlalchemy import psycopg_connection

    session = scoped_session(sessionmaker(engine))
    try:
        job = _claimed(queue, aqueue)
        with session.begin():
            _effect(session, job)  # type: ignore[arg-type]
            session.flush()
            job.complete_in(psycopg_connection(session))  # type: ignore[arg-type]
        job.mark_completed()
        with session.begin():
            queue.enqueue("reports", {"n": 2}, conn=psycopg_connection(session))  # type: ignore[arg-type]
    finally:
        session.remove()
    assert queue.get(job.job_id).status is JobStatus.DONE
    assert (counts.reports(), counts.jobs()) == (1, 2)


async def test_apsycopg_connection_takes_an_async_scoped_session(
    async_engine: AsyncEngine,  # noqa: F811
    queue: leaseq.Queue,
    aqueue: leaseq.AsyncQueue,
    counts: Counts,  # noqa: F811
) -> None:
    from sqlalchemy.ext.asyncio import async_scoped_session, async_sessionmaker

    from leaseq.contrib.sqlalchemy import apsycopg_connection

    session = async_scoped_session(async_sessionmaker(async_engine), scopefunc=asyncio.current_task)
    try:
        job = _claimed(queue, aqueue)
        async with session.begin():
            _effect(session, job)  # type: ignore[arg-type]
            await session.flush()
            await job.acomplete_in(await apsycopg_connection(session))  # type: ignore[arg-type]
        job.mark_completed()
    finally:
        await session.remove()
    assert queue.get(job.job_id).status is JobStatus.DONE
    assert counts.reports() == 1


# -- job_session on an engine in autocommit: refused before the block runs ------------


def test_a_job_session_on_an_autocommit_engine_is_refused_before_its_effect(
    engine: Engine,  # noqa: F811
    queue: leaseq.Queue,
    aqueue: leaseq.AsyncQueue,
    counts: Counts,  # noqa: F811
) -> None:
    """docs/sqlalchemy.md: an engine in autocommit is refused. It was, but only at
    the block's end: each write of the effect had committed on its own by then,
    the job was not completed, and its next attempt wrote the effect again."""
    job = _claimed(queue, aqueue)
    autocommit = engine.execution_options(isolation_level="AUTOCOMMIT")
    ran: list[str] = []
    with (
        pytest.raises(leaseq.InvalidArgument, match="autocommit"),
        job_session(job, autocommit) as session,
    ):
        ran.append("the block")
        _effect(session, job)
        session.flush()  # on an autocommit engine: committed at once
    assert ran == []
    assert counts.reports() == 0
    assert queue.get(job.job_id).status is JobStatus.RUNNING
    assert not job.completed


async def test_a_job_async_session_on_an_autocommit_engine_is_refused_before_its_effect(
    async_engine: AsyncEngine,  # noqa: F811
    queue: leaseq.Queue,
    aqueue: leaseq.AsyncQueue,
    counts: Counts,  # noqa: F811
) -> None:
    job = _claimed(queue, aqueue)
    autocommit = async_engine.execution_options(isolation_level="AUTOCOMMIT")
    ran: list[str] = []
    with pytest.raises(leaseq.InvalidArgument, match="autocommit"):
        async with job_async_session(job, autocommit) as session:
            ran.append("the block")
            _effect(session, job)
            await session.flush()
    assert ran == []
    assert counts.reports() == 0
    assert not job.completed


# -- a session joined into the caller's open transaction commits nothing ----------------


@pytest.mark.parametrize(
    "mode", ["conditional_savepoint", "create_savepoint", "rollback_only", "control_fully"]
)
def test_a_job_session_joined_into_an_open_transaction_reports_no_uncommitted_completion(
    engine: Engine,  # noqa: F811
    queue: leaseq.Queue,
    aqueue: leaseq.AsyncQueue,
    counts: Counts,  # noqa: F811
    mode: Any,
) -> None:
    """docs/sqlalchemy.md: the block commits the effect and the completion, "then
    tells the worker the job is done". A sessionmaker bound to a Connection whose
    transaction is already open (SQLAlchemy's "join a session into an external
    transaction") leaves that transaction to its owner: the session's commit
    committed nothing, and still the job was marked completed (the worker counts
    it done, runs on_success, stops renewing its lease) while the caller's
    transaction could roll it back. A job reported completed is done, with its
    effect, for everyone else; or the block is refused before anything is written."""
    from sqlalchemy.orm import sessionmaker

    job = _claimed(queue, aqueue)
    with engine.connect() as conn:
        conn.execute(text("SELECT 1"))  # the caller's transaction (autobegun)
        try:
            with job_session(job, sessionmaker(bind=conn, join_transaction_mode=mode)) as s:
                _effect(s, job)
        except leaseq.InvalidArgument:
            assert not job.completed
            assert conn.in_transaction()  # the caller's, left as it was
        seen = (queue.get(job.job_id).status, counts.reports())
        conn.rollback()  # the caller's own decision
    if job.completed:
        assert seen == (JobStatus.DONE, 1)
    else:
        assert seen == (JobStatus.RUNNING, 0)
    assert (queue.get(job.job_id).status, counts.reports()) == seen


async def test_a_job_async_session_joined_into_an_open_transaction_is_refused(
    async_engine: AsyncEngine,  # noqa: F811
    queue: leaseq.Queue,
    aqueue: leaseq.AsyncQueue,
    counts: Counts,  # noqa: F811
) -> None:
    from sqlalchemy.ext.asyncio import async_sessionmaker

    job = _claimed(queue, aqueue)
    async with async_engine.connect() as conn:
        await conn.execute(text("SELECT 1"))
        try:
            async with job_async_session(job, async_sessionmaker(bind=conn)) as s:
                _effect(s, job)
        except leaseq.InvalidArgument:
            assert not job.completed
        seen = (queue.get(job.job_id).status, counts.reports())
        await conn.rollback()
    assert seen == ((JobStatus.DONE, 1) if job.completed else (JobStatus.RUNNING, 0))
    assert (queue.get(job.job_id).status, counts.reports()) == seen


# -- REPEATABLE READ and SERIALIZABLE: the worker renews the lease during the block -----


@pytest.mark.parametrize("isolation", ["REPEATABLE READ", "SERIALIZABLE"])
async def test_a_block_in_one_snapshot_completes_although_the_worker_renewed_meanwhile(  # noqa: PLR0917
    engine: Engine,  # noqa: F811
    async_engine: AsyncEngine,  # noqa: F811
    queue: leaseq.Queue,
    aqueue: leaseq.AsyncQueue,
    counts: Counts,  # noqa: F811
    isolation: str,
) -> None:
    """An engine in REPEATABLE READ or SERIALIZABLE reads one snapshot: the
    worker's renewal of the lease (every few seconds while the handler runs)
    changed the job's row after it, and the block's completion failed with a
    serialization failure, its effect rolled back; a block that lasted past a
    renewal failed on every attempt, until the job failed for good. Here the
    worker's heartbeat (``renew_many``) runs inside the block, after its first
    read."""
    for asynchronous in (False, True):
        job = _claimed(queue, aqueue)
        if asynchronous:
            aengine = async_engine.execution_options(isolation_level=isolation)
            async with job_async_session(job, aengine) as asession:
                await asession.execute(text("SELECT 1"))  # the snapshot
                await aqueue.renew_many([job.claim])  # the worker's heartbeat
                _effect(asession, job)
        else:
            with job_session(job, engine.execution_options(isolation_level=isolation)) as s:
                s.execute(text("SELECT 1"))
                await asyncio.to_thread(queue.renew_many, [job.claim])
                _effect(s, job)
        assert (queue.get(job.job_id).status, job.completed) == (JobStatus.DONE, True)
    assert counts.reports() == 2
