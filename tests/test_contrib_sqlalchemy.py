"""leaseq.contrib.sqlalchemy against the real database: jobs commit and roll back
with SQLAlchemy transactions (Session, Connection, AsyncSession), and a handler's
ORM effect commits with its job's completion, once, whatever crashes in between.

The business table lives in the test's schema: the engines translate the models'
default schema to it (``schema_translate_map``), so parallel tests stay apart.
"""

from __future__ import annotations

import asyncio
import re
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import psycopg
import pytest
from sqlalchemy import URL, Engine, create_engine, insert, make_url, select
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, create_async_engine
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column, sessionmaker

import leaseq
from leaseq import JobStatus
from leaseq.contrib.sqlalchemy import (
    apsycopg_connection,
    job_async_session,
    job_session,
    psycopg_connection,
)
from leaseq.testing import aset_clock_offset, set_clock_offset

from .conftest import ROOT

Connect = Callable[..., psycopg.Connection[tuple[object, ...]]]


class Base(DeclarativeBase):
    pass


class Report(Base):
    """The application's row, and a handler's effect. ``key`` is deliberately not
    unique: an effect that committed twice shows as two rows."""

    __tablename__ = "report"
    id: Mapped[int] = mapped_column(primary_key=True)
    key: Mapped[str]
    customer: Mapped[str]


# -- engines on the test's schema --------------------------------------------------


def _sqlalchemy_url(database_url: str) -> URL:
    return make_url(database_url).set(drivername="postgresql+psycopg")


@pytest.fixture
def engine(database_url: str, schema: str, queue: leaseq.Queue) -> Iterator[Engine]:
    """A psycopg 3 engine whose models land in the test's (migrated) schema."""
    engine = create_engine(
        _sqlalchemy_url(database_url), execution_options={"schema_translate_map": {None: schema}}
    )
    Base.metadata.create_all(engine)
    yield engine
    engine.dispose()


@pytest.fixture
async def async_engine(
    database_url: str, schema: str, engine: Engine, aqueue: leaseq.AsyncQueue
) -> AsyncIterator[AsyncEngine]:
    """The async twin of ``engine`` (which created the table), on the test's loop."""
    async_engine = create_async_engine(
        _sqlalchemy_url(database_url), execution_options={"schema_translate_map": {None: schema}}
    )
    yield async_engine
    await async_engine.dispose()


class Counts:
    """What the test's schema holds, read on a connection of its own."""

    def __init__(self, connect: Connect, schema: str) -> None:
        self.connect = connect
        self.schema = schema

    def _one(self, sql: str) -> Any:
        with self.connect() as conn:
            row = conn.execute(sql).fetchone()
        assert row is not None
        return row[0]

    def reports(self) -> int:
        return int(self._one(f'SELECT count(*) FROM "{self.schema}".report'))

    def jobs(self) -> int:
        return int(self._one(f'SELECT count(*) FROM "{self.schema}".job'))

    def payloads(self) -> list[Any]:
        return list(self._one(f'SELECT array_agg(payload) FROM "{self.schema}".job'))


@pytest.fixture
def counts(connect: Connect, schema: str) -> Counts:
    return Counts(connect, schema)


# -- enqueue in the application's transaction ---------------------------------------


@pytest.mark.parametrize("ending", ["commit", "rollback"])
def test_a_job_enqueued_in_a_session_commits_and_rolls_back_with_its_orm_write(
    engine: Engine, queue: leaseq.Queue, counts: Counts, ending: str
) -> None:
    with Session(engine) as session:  # no begin(): the session begins on its own
        report = Report(key="acme-2026-11", customer="acme")
        session.add(report)
        session.flush()  # the generated id, for the payload
        report_id = report.id
        job_id = queue.enqueue(
            "reports", {"report_id": report_id}, conn=psycopg_connection(session)
        )
        getattr(session, ending)()
    expected = 1 if ending == "commit" else 0
    assert (counts.reports(), counts.jobs()) == (expected, expected)
    if ending == "commit":
        assert queue.get(job_id).payload == {"report_id": report_id}


@pytest.mark.parametrize("ending", ["commit", "rollback"])
def test_a_job_enqueued_on_a_core_connection_commits_and_rolls_back_with_it(
    engine: Engine, queue: leaseq.Queue, counts: Counts, ending: str
) -> None:
    with engine.connect() as conn:
        # No statement yet: SQLAlchemy has begun nothing, and still the job must
        # ride on the transaction that conn.commit() commits.
        queue.enqueue("reports", {"customer": "acme"}, conn=psycopg_connection(conn))
        conn.execute(insert(Report).values(key="k", customer="acme"))
        getattr(conn, ending)()
    expected = 1 if ending == "commit" else 0
    assert (counts.reports(), counts.jobs()) == (expected, expected)


def test_a_job_alone_on_a_fresh_core_connection_commits_with_it(
    engine: Engine, queue: leaseq.Queue, counts: Counts
) -> None:
    """Nothing but the enqueue ran on the connection: its commit() still has a
    transaction to commit (SQLAlchemy's, begun by psycopg_connection)."""
    with engine.connect() as conn:
        queue.enqueue("reports", {"customer": "acme"}, conn=psycopg_connection(conn))
        conn.commit()
    assert counts.jobs() == 1


@pytest.mark.parametrize("ending", ["commit", "rollback"])
async def test_a_job_enqueued_in_an_async_session_commits_and_rolls_back_with_it(
    async_engine: AsyncEngine,
    aqueue: leaseq.AsyncQueue,
    counts: Counts,
    ending: str,
) -> None:
    async with AsyncSession(async_engine) as session:
        session.add(Report(key="acme-2026-11", customer="acme"))
        await aqueue.enqueue(
            "reports", {"customer": "acme"}, conn=await apsycopg_connection(session)
        )
        await getattr(session, ending)()
    expected = 1 if ending == "commit" else 0
    assert (counts.reports(), counts.jobs()) == (expected, expected)


async def test_a_job_enqueued_on_an_async_connection_commits_with_it(
    async_engine: AsyncEngine, aqueue: leaseq.AsyncQueue, counts: Counts
) -> None:
    async with async_engine.begin() as conn:
        await conn.execute(insert(Report).values(key="k", customer="acme"))
        await aqueue.enqueue_many(
            "reports", [{"n": 1}, {"n": 2}], conn=await apsycopg_connection(conn)
        )
    assert (counts.reports(), counts.jobs()) == (1, 2)


def test_a_job_enqueued_in_a_rolled_back_savepoint_goes_with_it(
    engine: Engine, queue: leaseq.Queue, counts: Counts
) -> None:
    with Session(engine) as session, session.begin():
        session.add(Report(key="kept", customer="acme"))
        queue.enqueue("reports", {"n": "kept"}, conn=psycopg_connection(session))
        savepoint = session.begin_nested()
        session.add(Report(key="dropped", customer="acme"))
        queue.enqueue("reports", {"n": "dropped"}, conn=psycopg_connection(session))
        savepoint.rollback()
    assert (counts.reports(), counts.jobs()) == (1, 1)
    assert counts.payloads() == [{"n": "kept"}]


# -- refused before anything is written ---------------------------------------------


def test_a_session_not_on_psycopg_3_is_refused(queue: leaseq.Queue, counts: Counts) -> None:
    sqlite = create_engine("sqlite://")
    with Session(sqlite) as session, pytest.raises(leaseq.InvalidArgument, match="psycopg"):
        psycopg_connection(session)
    with sqlite.connect() as conn, pytest.raises(leaseq.InvalidArgument, match="sqlite"):
        psycopg_connection(conn)
    assert counts.jobs() == 0


def test_an_autocommit_engine_is_refused_and_nothing_is_written(
    queue: leaseq.Queue, engine: Engine, counts: Counts
) -> None:
    autocommit = engine.execution_options(isolation_level="AUTOCOMMIT")
    with Session(autocommit) as session:
        session.add(Report(key="k", customer="acme"))
        with pytest.raises(leaseq.InvalidArgument, match="autocommit"):
            queue.enqueue("reports", {}, conn=psycopg_connection(session))
    assert (counts.reports(), counts.jobs()) == (0, 0)


async def test_sync_and_async_sessions_are_not_mixed_up(
    engine: Engine, async_engine: AsyncEngine
) -> None:
    async with AsyncSession(async_engine) as async_session:
        with pytest.raises(leaseq.InvalidArgument, match="apsycopg_connection"):
            psycopg_connection(async_session)  # type: ignore[arg-type]
    with Session(engine) as session, pytest.raises(leaseq.InvalidArgument, match="for a sync"):
        await apsycopg_connection(session)  # type: ignore[arg-type]


# -- handlers: the ORM effect and the completion in one transaction -------------------


async def _until(condition: Callable[[], Awaitable[bool]], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not await condition():
        if time.monotonic() > deadline:
            pytest.fail("condition not reached in time")
        await asyncio.sleep(0.05)


class Running:
    """A real worker running in the background of a test (on the test's loop)."""

    def __init__(self, app: leaseq.App, aqueue: leaseq.AsyncQueue) -> None:
        self.worker = leaseq.Worker(
            app, dsn=aqueue.dsn, concurrency=4, poll_interval=0.1, metrics=None
        )
        self.task = asyncio.create_task(self.worker.run())

    async def until_finished(self, aqueue: leaseq.AsyncQueue, job_id: int) -> leaseq.Job:
        async def finished() -> bool:
            status = (await aqueue.get(job_id)).status
            return status in {JobStatus.DONE, JobStatus.FAILED}

        try:
            await _until(finished)
        finally:
            self.worker.request_stop()
            await asyncio.wait_for(self.task, 30)
        return await aqueue.get(job_id)


def _effect(session: Session | AsyncSession, job: leaseq.JobContext) -> None:
    session.add(Report(key=job.idempotency_key, customer=job.payload["customer"]))


async def test_a_sync_handler_writes_its_effect_and_completes_in_one_session(
    engine: Engine, aqueue: leaseq.AsyncQueue, counts: Counts
) -> None:
    app = leaseq.App(schema=aqueue.schema)

    @app.task("reports")
    def generate(job: leaseq.JobContext) -> None:
        assert threading.current_thread() is not threading.main_thread()
        with job_session(job, engine) as session:
            _effect(session, job)
            job.result = {"pages": 3}

    job_id = await aqueue.enqueue("reports", {"customer": "acme"})
    job = await Running(app, aqueue).until_finished(aqueue, job_id)
    assert (job.status, job.attempts) == (JobStatus.DONE, 1)
    assert await aqueue.result(job_id) == {"pages": 3}
    assert counts.reports() == 1


async def test_an_async_handler_writes_its_effect_and_completes_in_one_session(
    async_engine: AsyncEngine,
    aqueue: leaseq.AsyncQueue,
    counts: Counts,
) -> None:
    app = leaseq.App(schema=aqueue.schema)

    @app.task("reports")
    async def generate(job: leaseq.JobContext) -> None:
        async with job_async_session(job, async_engine) as session:
            _effect(session, job)
            job.result = {"pages": 3}

    job_id = await aqueue.enqueue("reports", {"customer": "acme"})
    job = await Running(app, aqueue).until_finished(aqueue, job_id)
    assert (job.status, job.attempts) == (JobStatus.DONE, 1)
    assert await aqueue.result(job_id) == {"pages": 3}
    assert counts.reports() == 1


#: How the first attempt dies after writing its effect and before its commit.
CRASHES = ["exception", "killed backend", "lost lease"]


@pytest.mark.parametrize("crash", CRASHES)
async def test_a_crash_between_the_effect_and_the_commit_leaves_exactly_one_effect(
    engine: Engine,
    queue: leaseq.Queue,
    aqueue: leaseq.AsyncQueue,
    counts: Counts,
    crash: str,
) -> None:
    app = leaseq.App(schema=aqueue.schema)

    @app.task("reports", lease=60, backoff=(0.05, 0.1))
    def generate(job: leaseq.JobContext) -> None:
        with job_session(job, engine) as session:
            _effect(session, job)
            session.flush()  # the effect is in the database, uncommitted
            if job.attempts == 1:
                _crash(crash, session, queue, counts.connect)

    job_id = await aqueue.enqueue("reports", {"customer": "acme"})
    job = await Running(app, aqueue).until_finished(aqueue, job_id)
    assert (job.status, job.attempts) == (JobStatus.DONE, 2)
    assert counts.reports() == 1


def _crash(crash: str, session: Session, queue: leaseq.Queue, connect: Connect) -> None:
    if crash == "exception":
        raise RuntimeError("the handler broke after writing its effect")
    if crash == "killed backend":
        pid = psycopg_connection(session).info.backend_pid
        connect(autocommit=True).execute("SELECT pg_terminate_backend(%s)", (pid,))
    if crash == "lost lease":
        set_clock_offset(queue, 120)  # the 60 s lease is over: the completion is refused


async def test_an_async_handler_that_lost_its_lease_leaves_exactly_one_effect(
    async_engine: AsyncEngine,
    aqueue: leaseq.AsyncQueue,
    counts: Counts,
) -> None:
    app = leaseq.App(schema=aqueue.schema)

    @app.task("reports", lease=60)
    async def generate(job: leaseq.JobContext) -> None:
        async with job_async_session(job, async_engine) as session:
            _effect(session, job)
            await session.flush()
            if job.attempts == 1:
                await aset_clock_offset(aqueue, 120)

    job_id = await aqueue.enqueue("reports", {"customer": "acme"})
    job = await Running(app, aqueue).until_finished(aqueue, job_id)
    assert (job.status, job.attempts) == (JobStatus.DONE, 2)
    assert counts.reports() == 1


# -- the block's rules, on a claim taken by hand ------------------------------------


def _claimed(queue: leaseq.Queue, aqueue: leaseq.AsyncQueue) -> leaseq.JobContext:
    queue.enqueue("reports", {"customer": "acme"})
    (claim,) = queue.claim("reports", lease=60)
    return leaseq.JobContext(claim, queue, aqueue)


async def test_a_rerun_of_the_completing_transaction_rolls_its_effect_back(
    engine: Engine, queue: leaseq.Queue, aqueue: leaseq.AsyncQueue, counts: Counts
) -> None:
    """As after an ambiguous commit: the handler's whole block runs again."""
    job = _claimed(queue, aqueue)
    factory = sessionmaker(engine)  # expire_on_commit=True: the factory's settings hold
    with job_session(job, factory) as session:
        _effect(session, job)
    with pytest.raises(leaseq.AlreadyCompleted), job_session(job, factory) as session:
        _effect(session, job)
    assert queue.get(job.job_id).status is JobStatus.DONE
    assert counts.reports() == 1


async def test_a_lost_attempt_opens_no_session(
    engine: Engine, queue: leaseq.Queue, aqueue: leaseq.AsyncQueue, counts: Counts
) -> None:
    job = _claimed(queue, aqueue)
    job.mark_lost("lease lost")
    with pytest.raises(leaseq.LeaseLost), job_session(job, engine) as session:
        pytest.fail("the block must not run")
        _effect(session, job)
    assert (queue.get(job.job_id).status, job.completed) == (JobStatus.RUNNING, False)


async def test_a_commit_inside_the_block_is_refused_and_commits_nothing(
    engine: Engine, queue: leaseq.Queue, aqueue: leaseq.AsyncQueue, counts: Counts
) -> None:
    """Refused before it is sent: neither the effect nor the completion commits."""
    job = _claimed(queue, aqueue)
    with (
        pytest.raises(leaseq.InvalidArgument, match="commit inside the job_session block"),
        job_session(job, engine) as session,
    ):
        _effect(session, job)
        session.commit()
    assert (queue.get(job.job_id).status, job.completed) == (JobStatus.RUNNING, False)
    assert counts.reports() == 0


async def test_a_commit_inside_the_async_block_is_refused_and_commits_nothing(
    async_engine: AsyncEngine, queue: leaseq.Queue, aqueue: leaseq.AsyncQueue, counts: Counts
) -> None:
    job = _claimed(queue, aqueue)
    with pytest.raises(leaseq.InvalidArgument, match="commit inside the job_session block"):
        async with job_async_session(job, async_engine) as session:
            _effect(session, job)
            await session.commit()
    assert (queue.get(job.job_id).status, job.completed) == (JobStatus.RUNNING, False)
    assert counts.reports() == 0


async def test_a_commit_of_the_sessions_connection_is_refused_and_commits_nothing(
    engine: Engine,
    async_engine: AsyncEngine,
    queue: leaseq.Queue,
    aqueue: leaseq.AsyncQueue,
    counts: Counts,
) -> None:
    """``session.connection().commit()`` was not refused: the effect committed
    alone, the attempt then failed on the ended transaction (a retryable error),
    and every retry committed the effect again."""
    job = _claimed(queue, aqueue)
    with (
        pytest.raises(leaseq.InvalidArgument, match="commit inside the job_session block"),
        job_session(job, engine) as session,
    ):
        _effect(session, job)
        session.connection().commit()
    other = _claimed(queue, aqueue)
    with pytest.raises(leaseq.InvalidArgument, match="commit inside the job_session block"):
        async with job_async_session(other, async_engine) as asession:
            _effect(asession, other)
            await (await asession.connection()).commit()
    for claimed in (job, other):
        assert (queue.get(claimed.job_id).status, claimed.completed) == (JobStatus.RUNNING, False)
    assert counts.reports() == 0


async def test_a_callers_own_connection_commits_again_after_the_block(
    engine: Engine, queue: leaseq.Queue, aqueue: leaseq.AsyncQueue, counts: Counts
) -> None:
    """A sessionmaker bound to the caller's own Connection (SQLAlchemy's "join a
    session into an external transaction"): the block's refusal of a commit
    stayed on that Connection, and every later commit of it, outside any block,
    raised InvalidArgument."""
    job = _claimed(queue, aqueue)
    with engine.connect() as conn:
        with pytest.raises(RuntimeError), job_session(job, sessionmaker(bind=conn)) as session:
            _effect(session, job)
            raise RuntimeError("the effect fails: rolled back")
        Report.__table__.create(conn, checkfirst=True)  # ordinary work afterwards
        conn.commit()  # refused before


async def test_a_rollback_inside_the_block_is_refused_at_the_call(
    engine: Engine,
    async_engine: AsyncEngine,
    queue: leaseq.Queue,
    aqueue: leaseq.AsyncQueue,
    counts: Counts,
) -> None:
    """docs/sqlalchemy.md: refused "at the call itself". It ran, and the handler
    went on after it, its later writes outside the job's transaction."""
    after: list[str] = []
    job = _claimed(queue, aqueue)
    with (
        pytest.raises(leaseq.InvalidArgument, match="rollback inside the job_session block"),
        job_session(job, engine) as session,
    ):
        _effect(session, job)
        session.rollback()
        after.append("sync")
    other = _claimed(queue, aqueue)
    with pytest.raises(leaseq.InvalidArgument, match="rollback inside the job_session block"):
        async with job_async_session(other, async_engine) as asession:
            _effect(asession, other)
            await asession.rollback()
            after.append("async")
    assert after == []
    for claimed in (job, other):
        assert (queue.get(claimed.job_id).status, claimed.completed) == (JobStatus.RUNNING, False)
    assert counts.reports() == 0


async def test_a_savepoint_inside_the_block_still_commits_with_the_job(
    engine: Engine, queue: leaseq.Queue, aqueue: leaseq.AsyncQueue, counts: Counts
) -> None:
    job = _claimed(queue, aqueue)
    with job_session(job, engine) as session, session.begin_nested():
        _effect(session, job)
    assert (queue.get(job.job_id).status, job.completed) == (JobStatus.DONE, True)
    assert counts.reports() == 1


# -- the README's example runs as written ---------------------------------------------


async def test_the_readme_example_runs(
    database_url: str, schema: str, aqueue: leaseq.AsyncQueue, monkeypatch: pytest.MonkeyPatch
) -> None:
    readme = (ROOT / "README.md").read_text()
    match = re.search(r"<!-- example: sqlalchemy -->\s*```python\n(.*?)```", readme, re.DOTALL)
    assert match is not None, "README.md has no SQLAlchemy example"
    code = match.group(1)
    # Into this test's schema: leaseq's tables and (through search_path) the models'.
    code = _replace(code, "leaseq.Queue()", f'leaseq.Queue(schema="{schema}")')
    code = _replace(code, "leaseq.App()", f'leaseq.App(schema="{schema}")')
    code = _replace(
        code,
        "create_engine(",
        f"create_engine(connect_args={{'options': '-c search_path={schema}'}}, url=",
    )
    monkeypatch.setenv("DATABASE_URL", database_url)
    namespace: dict[str, Any] = {"__name__": "readme_example"}
    await asyncio.to_thread(exec, code, namespace)  # it blocks: keep the loop free
    engine: Engine = namespace["engine"]
    try:
        # The request, as the web service would make it.
        job_id = await asyncio.to_thread(namespace["request_report"], "acme")
        job = await Running(namespace["app"], aqueue).until_finished(aqueue, job_id)
        with Session(engine) as session:
            report = session.scalars(select(namespace["Report"])).one()
    finally:
        engine.dispose()
        namespace["queue"].close()
    assert job.status is JobStatus.DONE
    assert report.body == "report for acme"


def _replace(code: str, old: str, new: str) -> str:
    assert old in code, f"the README example no longer says {old}"
    return code.replace(old, new)
