"""Handlers with executor="process": run in child processes, with the worker's own
fencing, outcomes, timeouts and lost-lease signals (tests/process_app.py)."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import multiprocessing.connection
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import leaseq
from leaseq import JobStatus
from leaseq._worker import processes
from leaseq.testing import adrain, aset_clock_offset, drain, set_clock_offset

from . import process_app
from .conftest import ROOT


@pytest.fixture
def tables(queue: leaseq.Queue) -> leaseq.Queue:
    with queue.connection() as conn:
        for statement in process_app.TABLES:
            conn.execute(statement.format(schema=f'"{queue.schema}"'))
    return queue


def _app(schema: str, **options: Any) -> leaseq.App:
    app = leaseq.App(schema=schema)
    for name in ("spin", "effect", "polite", "stubborn", "crash", "raises", "unsendable"):
        app.task(name, executor="process", **options)(getattr(process_app, name))
    return app


def _rows(queue: leaseq.Queue, sql: str, *params: Any) -> list[tuple[Any, ...]]:
    with queue.connection() as conn:
        return conn.execute(sql.replace("{schema}", f'"{queue.schema}"'), params).fetchall()


def test_a_process_handler_runs_in_a_child_and_completes(
    tables: leaseq.Queue, database_url: str, schema: str
) -> None:
    queue = tables
    spins = queue.enqueue_many("spin", [{"n": 1000 * (i + 1)} for i in range(4)])
    effects = queue.enqueue_many("effect", [{"schema": schema} for _ in range(3)])

    stats = drain(_app(schema), dsn=database_url, concurrency=2)

    assert stats.completed == 7
    results = [queue.result(job_id) for job_id in spins]
    assert [r["total"] for r in results] == [
        sum(i * i % 7 for i in range(1000 * (n + 1))) for n in range(4)
    ]
    pids = {r["pid"] for r in results}
    assert os.getpid() not in pids
    assert len(pids) <= 2  # one child per slot, reused
    # The effect and its completion committed together, in the child.
    assert sorted(job_id for job_id, _ in _rows(queue, "SELECT * FROM {schema}.effect")) == sorted(
        effects
    )
    for job_id in effects:
        assert queue.get(job_id).status is JobStatus.DONE
        assert queue.result(job_id)["written_by"] != os.getpid()


@pytest.mark.server_agnostic  # the child processes' lifecycle
def test_a_timeout_tells_the_child_and_a_child_that_stays_is_killed(
    tables: leaseq.Queue, database_url: str, schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    queue = tables
    monkeypatch.setattr(processes, "KILL_AFTER", 1.0)
    # A timeout counts from the claim: a child started for the attempt takes part
    # of it (a second or so on a busy machine).
    polite = queue.enqueue("polite", {"schema": schema}, timeout=3.0)
    stubborn = queue.enqueue("stubborn", {"schema": schema}, timeout=3.0)

    app = _app(schema)
    stats = drain(app, dsn=database_url, concurrency=2)
    set_clock_offset(queue, 600)  # past the retries' backoff
    drain(app, dsn=database_url, concurrency=2)

    seen = _rows(queue, "SELECT job_id, attempt, what FROM {schema}.seen ORDER BY job_id, what")
    # The polite one was told (job.lost) in its process; its late effect was refused.
    assert (polite, 1, "told") in seen
    # The stubborn one never looked; its process was killed before it went on.
    assert (stubborn, 1, "started") in seen
    assert (stubborn, 1, "still alive") not in seen
    assert stats.timeouts == 2
    for job_id in (polite, stubborn):
        job = queue.get(job_id)
        assert job.status is JobStatus.DONE  # the second attempt (its timeout is per attempt)
        assert "timed out" in job.history[0].get("error", "")
    effects = _rows(queue, "SELECT job_id, count(*) FROM {schema}.effect GROUP BY job_id")
    assert sorted(effects) == sorted([(polite, 1), (stubborn, 1)])  # once each


@pytest.mark.asyncio
async def test_a_lost_lease_reaches_the_child_and_its_effect_is_refused(
    tables: leaseq.Queue, aqueue: leaseq.AsyncQueue, database_url: str, schema: str
) -> None:
    queue = tables
    job_id = queue.enqueue("polite", {"schema": schema})
    app = leaseq.App(schema=schema)
    app.task("polite", executor="process", lease=3.0)(process_app.polite)
    draining = asyncio.create_task(adrain(app, dsn=database_url, timeout=60))
    while not _rows(queue, "SELECT 1 FROM {schema}.seen WHERE what = 'started'"):
        await asyncio.sleep(0.05)
    await aset_clock_offset(aqueue, 3600)  # the lease is gone: the next renewal says so
    while not _rows(queue, "SELECT 1 FROM {schema}.seen WHERE what = 'told'"):
        await asyncio.sleep(0.05)
    stats = await draining
    assert stats.lost_leases == 1
    # The child's completion was refused with its effect; the job, recovered, ran again.
    assert _rows(queue, "SELECT job_id FROM {schema}.effect") == [(job_id,)]
    job = queue.get(job_id)
    assert job.status is JobStatus.DONE
    assert job.attempts == 2


def test_a_dead_child_fails_the_attempt_not_the_worker(
    tables: leaseq.Queue, database_url: str, schema: str
) -> None:
    queue = tables
    job_id = queue.enqueue("crash", {"schema": schema})
    other = queue.enqueue("effect", {"schema": schema})

    app = _app(schema)
    stats = drain(app, dsn=database_url, concurrency=2)
    set_clock_offset(queue, 600)  # past the retry's backoff
    stats.completed += drain(app, dsn=database_url, concurrency=2).completed

    job = queue.get(job_id)
    assert job.status is JobStatus.DONE
    assert job.attempts == 2
    assert "exit code 3" in job.history[0].get("error", "")
    assert queue.get(other).status is JobStatus.DONE
    assert stats.completed == 2


def test_a_childs_exceptions_keep_their_meaning(
    tables: leaseq.Queue, database_url: str, schema: str
) -> None:
    queue = tables
    retry, permanent, value, stop = (
        queue.enqueue("raises", {"raise": kind}) for kind in ("retry", "permanent", "value", "stop")
    )
    # A long backoff: the retried job must not come due while the drain runs.
    drain(_app(schema, max_attempts=2, backoff=(600, 600)), dsn=database_url, concurrency=4)

    job = queue.get(retry)  # job.retry(delay=600): queued again, ten minutes out
    assert job.status is JobStatus.QUEUED
    assert "later, please" in (job.last_error or "")
    ((later,),) = _rows(
        queue,
        "SELECT available_at > now() + interval '500 seconds' FROM {schema}.job WHERE job_id = %s",
        retry,
    )
    assert later
    assert queue.get(permanent).status is JobStatus.FAILED  # PermanentError: no retry
    assert queue.get(permanent).attempts == 1
    job = queue.get(value)
    assert job.status is JobStatus.QUEUED  # an ordinary error: retried
    assert job.last_error == "ValueError: bad ***"  # its payload's "value" masked (contract 7)
    job = queue.get(stop)  # retried too, not left running for ever
    assert (job.status, job.attempts) == (JobStatus.QUEUED, 1)
    assert "StopIteration" in (job.last_error or "")


def test_a_result_the_child_cannot_send_back_fails_the_job_at_once(
    tables: leaseq.Queue, database_url: str, schema: str
) -> None:
    """A lambda, a structure nested past pickle's limit: no attempt could send it
    back either, so the job fails with InvalidResult (not retried as an error,
    nor a child that died of a RecursionError)."""
    queue = tables
    # (one whose pickling raises ValueError crashed the child: retried as a death)
    ids = [
        queue.enqueue("unsendable", {"what": what})
        # (one the worker cannot unpickle was retried as the handler's TypeError)
        for what in ("lambda", "deep", "refuses", "unreceivable")
    ]
    drain(_app(schema, max_attempts=3, backoff=(0, 0)), dsn=database_url, concurrency=2)
    for job_id in ids:
        job = queue.get(job_id)
        assert (job.status, job.attempts) == (JobStatus.FAILED, 1), job.last_error
        assert "InvalidResult: result cannot be stored" in (job.last_error or "")


def test_a_child_that_dies_once_its_transaction_committed_leaves_its_job_done(
    tables: leaseq.Queue, database_url: str, schema: str
) -> None:
    """Killed (the OOM killer) right after job.transaction() committed: the job is
    done, but the worker took the death for a failed attempt, sent a retry that
    the fence refused, counted a lost lease and ran no on_success hook."""
    queue = tables
    app = leaseq.App(schema=schema)
    app.task("dies", executor="process")(process_app.completes_then_dies)
    succeeded: list[tuple[int, Any]] = []
    app.on_success(lambda job, result: succeeded.append((job.job_id, result)))
    job_id = queue.enqueue("dies", {"schema": schema})
    stats = drain(app, dsn=database_url)
    assert queue.get(job_id).status is JobStatus.DONE
    assert (stats.completed, stats.lost_leases) == (1, 0)
    assert succeeded == [(job_id, {"effect": "done"})]  # the result its completion stored
    assert _rows(queue, "SELECT count(*) FROM {schema}.effect") == [(1,)]


def test_process_handlers_are_checked_when_declared(schema: str) -> None:
    app = leaseq.App(schema=schema)

    async def coroutine(job: leaseq.JobContext) -> None:
        pass

    def local(job: leaseq.JobContext) -> None:
        pass

    with pytest.raises(leaseq.InvalidArgument, match="plain def"):
        app.task("a", executor="process")(coroutine)
    with pytest.raises(leaseq.InvalidArgument, match="module-level"):
        app.task("b", executor="process")(local)
    with pytest.raises(leaseq.InvalidArgument, match="executor"):
        app.task("c", executor="fork")
    # Accepted, then every attempt failed in the child ('... has no attribute
    # __qualname__'): a process imports a function by its name.
    with pytest.raises(leaseq.InvalidArgument, match="module-level"):
        app.task("d", executor="process")(functools.partial(process_app.spin))
    with pytest.raises(leaseq.InvalidArgument, match="module-level"):
        app.task("e", executor="process")(process_app.CallableHandler())
    assert app.tasks == {}


@pytest.mark.asyncio
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
async def test_a_signal_sent_to_the_whole_process_group_does_not_end_a_childs_job(
    tables: leaseq.Queue, database_url: str, schema: str, signum: int
) -> None:
    """Ctrl-C in a terminal (SIGINT) and a service manager's stop (SIGTERM) reach
    every process of the group, the handlers' children too. The worker decides how
    its jobs end (it finishes them within its grace, or releases them); a child
    must not die of it (the job failed) nor send it back as the handler's error."""
    queue = tables
    job_id = queue.enqueue("patient", {"schema": schema})
    app = leaseq.App(schema=schema)
    app.task("patient", executor="process")(process_app.patient)
    draining = asyncio.create_task(adrain(app, dsn=database_url, timeout=60))
    while not (started := _rows(queue, "SELECT pid FROM {schema}.seen WHERE what = 'started'")):
        await asyncio.sleep(0.05)
    ((child,),) = started
    os.kill(child, signum)  # what the group's signal does to the child
    stats = await draining
    job = queue.get(job_id)
    assert (job.status, job.attempts) == (JobStatus.DONE, 1), job.history
    assert _rows(queue, "SELECT job_id FROM {schema}.effect") == [(job_id,)]
    assert stats.completed == 1


@pytest.mark.server_agnostic  # the child processes' lifecycle
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_to_the_group_while_a_child_starts_does_not_end_it(
    database_url: str, schema: str, signum: int
) -> None:
    """The group's signal can come while a child is still starting (its spawn and
    imports take a good part of a second), before it could ignore signals: it died
    of it, and its first job failed (with max_attempts=1, for good)."""
    pool = processes.ProcessPool(1, database_url, schema)
    try:
        child = pool._spawn()
        os.kill(child.process.pid, signum)  # at once: the child is starting
        child.process.join(2.0)
        assert child.process.is_alive(), child.process.exitcode
    finally:
        pool._children.append(child)
        pool._idle.append(child)  # it was never handed work: the pool's own to stop
        pool.close()


@pytest.mark.asyncio
@pytest.mark.server_agnostic  # the child processes' lifecycle
async def test_an_idle_child_that_died_is_replaced_before_it_is_handed_a_job(
    tables: leaseq.Queue, aqueue: leaseq.AsyncQueue, database_url: str, schema: str
) -> None:
    """Its job must run, at its first attempt (one attempt is all it has)."""
    queue = tables
    first = queue.enqueue("patient", {"schema": schema})
    app = leaseq.App(schema=schema)
    app.task("patient", executor="process", max_attempts=1)(process_app.patient)
    worker = leaseq.Worker(app, dsn=database_url, concurrency=1, poll_interval=0.1)
    running = asyncio.create_task(worker.run())
    try:
        while (await aqueue.get(first)).status is not JobStatus.DONE:
            assert not running.done()
            await asyncio.sleep(0.05)
        ((child,),) = _rows(queue, "SELECT pid FROM {schema}.seen WHERE job_id = %s", first)
        os.kill(child, signal.SIGKILL)  # the OOM killer, say, while it was idle
        await asyncio.sleep(0.5)
        second = await aqueue.enqueue("patient", {"schema": schema})
        while (job := await aqueue.get(second)).status in (JobStatus.QUEUED, JobStatus.RUNNING):
            assert not running.done()
            await asyncio.sleep(0.05)
        assert (job.status, job.attempts) == (JobStatus.DONE, 1), job.history
    finally:
        worker.request_stop()
        await asyncio.wait_for(running, 30)


@pytest.mark.asyncio
async def test_a_child_that_completed_its_job_may_work_on_after_its_transaction(
    tables: leaseq.Queue, database_url: str, schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its job.transaction() committed the completion; what it does next (a clean-up,
    a notification) runs to its end: the worker does not take the done job's
    refused renewal for a lost lease, tell the child, and kill it."""
    queue = tables
    monkeypatch.setattr(processes, "KILL_AFTER", 1.0)  # a child told would die before its end
    job_id = queue.enqueue("completes_then_works", {"schema": schema})
    app = leaseq.App(schema=schema)
    # Renewed every ~0.5 s: several renewals fall in the three seconds after the commit.
    app.task("completes_then_works", executor="process", lease=1.0)(
        process_app.completes_then_works
    )
    stats = await adrain(app, dsn=database_url, timeout=60)
    assert queue.get(job_id).status is JobStatus.DONE
    assert _rows(queue, "SELECT what FROM {schema}.seen WHERE job_id = %s", job_id) == [
        ("worked on",)
    ]
    assert stats.lost_leases == 0
    assert stats.completed == 1


@pytest.mark.server_agnostic  # the child processes' lifecycle
def test_a_child_that_completed_its_job_and_hangs_is_killed_at_its_timeout(
    tables: leaseq.Queue, database_url: str, schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Once its job.transaction() committed, the worker never told the child its
    timeout, nor killed it: it kept its slot for ever, and at concurrency 1 no
    other job ever ran."""
    queue = tables
    monkeypatch.setattr(processes, "KILL_AFTER", 1.0)
    hangs = queue.enqueue("completes_then_hangs", {"schema": schema})
    after = queue.enqueue("spin", {"n": 10})
    app = leaseq.App(schema=schema)
    app.task("completes_then_hangs", executor="process", timeout=2.0)(
        process_app.completes_then_hangs
    )
    app.task("spin", executor="process")(process_app.spin)

    drain(app, dsn=database_url, concurrency=1, timeout=60)

    assert queue.get(hangs).status is JobStatus.DONE  # its own transaction's completion
    assert queue.get(after).status is JobStatus.DONE  # the slot came back
    assert _rows(queue, "SELECT count(*) FROM {schema}.effect") == [(1,)]


def _running(pid: int) -> bool:
    """Whether process ``pid`` still runs (a zombie that no one reaped does not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return False
    return state not in ("Z", "X")


def _grandchildren(queue: leaseq.Queue) -> list[int]:
    """The processes the handlers started (process_app._start_grandchild)."""
    rows = _rows(queue, "SELECT pid FROM {schema}.seen WHERE what = 'grandchild'")
    return [pid for (pid,) in rows]


def _still_running(pids: list[int], within: float) -> list[int]:
    """Those of ``pids`` that still run after up to ``within`` seconds."""
    deadline = time.monotonic() + within
    while any(map(_running, pids)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return [pid for pid in pids if _running(pid)]


def _kill_all(pids: list[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


@pytest.mark.server_agnostic  # the child processes' lifecycle
@pytest.mark.parametrize("handler", ["stubborn_parent", "crashing_parent"])
def test_what_a_killed_or_dead_handler_started_ends_with_it(
    tables: leaseq.Queue,
    database_url: str,
    schema: str,
    monkeypatch: pytest.MonkeyPatch,
    handler: str,
) -> None:
    """A process the handler started (a converter it ran, say) belongs to its
    attempt. Killed at the timeout, or dead under its handler, the child left it
    running, orphaned, beside the job's next attempt: two renderings of one report
    at once, and a process per timed-out attempt piling up on the host."""
    queue = tables
    monkeypatch.setattr(processes, "KILL_AFTER", 1.0)
    job_id = queue.enqueue(handler, {"schema": schema}, timeout=3.0, max_attempts=1)
    app = leaseq.App(schema=schema)
    app.task(handler, executor="process")(getattr(process_app, handler))
    grandchildren: list[int] = []
    try:
        drain(app, dsn=database_url, concurrency=1, timeout=60)
        grandchildren = _grandchildren(queue)
        assert len(grandchildren) == 1
        assert queue.get(job_id).status is JobStatus.FAILED
        assert _still_running(grandchildren, within=5.0) == []
    finally:
        _kill_all(grandchildren or _grandchildren(queue))


@pytest.mark.server_agnostic  # the child processes' lifecycle
@pytest.mark.parametrize("handler", ["stubborn", "stubborn_parent"])
def test_a_child_leaves_when_its_worker_is_killed_outright(
    tables: leaseq.Queue, database_url: str, schema: str, handler: str
) -> None:
    """A worker killed with SIGKILL (or by the OOM killer) cannot stop its
    children: a busy child, reparented, ran on beside the job's next attempt
    elsewhere, for as long as its handler took (for ever, one that never
    returns). It now notices, is told (job.lost), and leaves, and takes the
    processes its handler started along."""
    queue = tables
    queue.enqueue(handler, {"schema": schema})  # its first attempt never returns
    worker = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import leaseq, leaseq.testing, sys\n"
            "from tests import process_app\n"
            "app = leaseq.App(schema=sys.argv[1])\n"
            "app.task(sys.argv[3], executor='process')(getattr(process_app, sys.argv[3]))\n"
            "leaseq.testing.drain(app, dsn=sys.argv[2], timeout=120)\n",
            schema,
            database_url,
            handler,
        ],
        cwd=ROOT,
    )
    try:
        deadline = time.monotonic() + 60
        while not (
            started := _rows(queue, "SELECT pid FROM {schema}.seen WHERE what = 'started'")
        ) or (
            handler == "stubborn_parent" and not _grandchildren(queue)  # (started next)
        ):
            assert time.monotonic() < deadline
            assert worker.poll() is None
            time.sleep(0.05)
        ((child,),) = started
    finally:
        worker.kill()
        worker.wait(10)
    grandchildren = _grandchildren(queue)
    try:
        assert _still_running([child], within=processes.KILL_AFTER + 10) == []
        assert _rows(queue, "SELECT what FROM {schema}.seen WHERE what = 'still alive'") == []
        assert _still_running(grandchildren, within=5.0) == []
    finally:
        _kill_all(grandchildren)


def test_a_childs_exception_that_pickle_cannot_rebuild_keeps_its_meaning(
    tables: leaseq.Queue, database_url: str, schema: str
) -> None:
    """An exception class whose constructor takes other arguments than its message
    (a common pattern) did not survive pickling: it came back as a plain
    ProcessHandlerError, so a PermanentError, or an error the task fails on, was
    retried until its attempts ran out (repeating any outside effect)."""
    queue = tables
    permanent = queue.enqueue("raises", {"raise": "permanent_two_args"})
    listed = queue.enqueue("raises", {"raise": "fail_on_two_args"})
    app = leaseq.App(schema=schema)
    app.task("raises", executor="process", max_attempts=3, fail_on=(process_app.Locked,))(
        process_app.raises
    )
    drain(app, dsn=database_url, concurrency=2)
    for job_id, text in ((permanent, "customer 7: deleted"), (listed, "invoice 12 is locked")):
        job = queue.get(job_id)
        assert (job.status, job.attempts) == (JobStatus.FAILED, 1), job.last_error
        assert text in (job.last_error or "")


# -- process handlers: stopping the children must not hold the event loop -----------


async def test_stopping_the_children_of_process_handlers_does_not_block_the_event_loop(
    tables: leaseq.Queue,
    database_url: str,
    schema: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """At a worker's stop its handlers' child processes are stopped: each is asked
    to leave and joined (2 s for one still busy, then killed). That ran on the
    event loop, which stood still meanwhile: an application that runs a Worker on
    its own loop (or a test's adrain) froze for seconds. (The worker closes its
    sync pool in a thread for the same reason.)"""
    from leaseq._worker import processes

    queue = tables
    queue.enqueue("stubborn", {"schema": schema})  # never looks at job.lost
    app = leaseq.App(schema=schema)
    app.task("stubborn", executor="process")(process_app.stubborn)
    worker = leaseq.Worker(
        app,
        dsn=database_url,
        concurrency=1,
        poll_interval=0.1,
        shutdown_grace=0,
        listen=False,
        maintenance=False,
        metrics=None,
    )
    ticks = [0]
    during_close: list[tuple[int, int]] = []
    close = processes.ProcessPool.close

    def counted_close(pool: processes.ProcessPool) -> None:
        before = ticks[0]
        close(pool)
        during_close.append((before, ticks[0]))

    monkeypatch.setattr(processes.ProcessPool, "close", counted_close)

    async def tick() -> None:
        while True:
            ticks[0] += 1
            await asyncio.sleep(0.01)

    ticker = asyncio.create_task(tick())
    running = asyncio.create_task(worker.run())
    try:
        with queue.connection() as conn:
            while not conn.execute(
                f"SELECT 1 FROM \"{schema}\".seen WHERE what = 'started'"
            ).fetchone():
                await asyncio.sleep(0.05)
        worker.request_stop()
        await asyncio.wait_for(running, 60)
    finally:
        ticker.cancel()
    ((before, after),) = during_close
    assert after > before, "the event loop did not run while the children were stopped"


@pytest.mark.asyncio
@pytest.mark.server_agnostic  # the child processes' lifecycle
async def test_a_busy_childs_pipe_is_closed_once_when_the_worker_stops(
    tables: leaseq.Queue, database_url: str, schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """At the stop, the pool (in its thread) killed a busy child and closed its pipe,
    while the attempt's thread, seeing the child dead, handed it back and closed the
    same pipe: both could pass the pipe's "still open" check and close its
    descriptor twice. The second close failed the stop (OSError EBADF, seen in CI),
    or closed whatever the process had opened meanwhile under that number (a
    database connection's socket). Each descriptor must be closed once."""
    queue = tables
    queue.enqueue("stubborn", {"schema": schema})  # never looks at job.lost
    app = leaseq.App(schema=schema)
    app.task("stubborn", executor="process")(process_app.stubborn)
    worker = leaseq.Worker(
        app,
        dsn=database_url,
        concurrency=1,
        poll_interval=0.1,
        shutdown_grace=0,
        listen=False,
        maintenance=False,
        metrics=None,
    )
    closes: list[int] = []  # id() of each pipe end whose descriptor was closed
    real_close = multiprocessing.connection.Connection._close

    def slow_close(pipe: multiprocessing.connection.Connection) -> None:
        closes.append(id(pipe))
        time.sleep(0.3)  # widens the window in which a second closer comes in
        real_close(pipe)

    monkeypatch.setattr(multiprocessing.connection.Connection, "_close", slow_close)
    running = asyncio.create_task(worker.run())
    with queue.connection() as conn:
        while not conn.execute(
            f"SELECT 1 FROM \"{schema}\".seen WHERE what = 'started'"
        ).fetchone():
            assert not running.done()
            await asyncio.sleep(0.05)
    worker.request_stop()
    await asyncio.wait_for(running, 60)  # an OSError of a second close fails it
    twice = sorted({pipe for pipe in closes if closes.count(pipe) > 1})
    assert not twice, f"{len(twice)} descriptors closed twice"


# -- process handlers: the child's connections are the worker's -------------------


def session_settings(job: leaseq.JobContext) -> None:
    """What the handler's sessions are set up with (module-level: a child imports it)."""
    with job.connection() as conn:
        row = conn.execute("SHOW idle_in_transaction_session_timeout").fetchone()
        plain = row[0] if row else None
    with job.transaction() as conn:
        row = conn.execute("SHOW idle_in_transaction_session_timeout").fetchone()
        job.result = {"connection": plain, "transaction": row[0] if row else None}


def test_a_process_handlers_sessions_are_set_up_as_a_thread_handlers(
    queue: leaseq.Queue, database_url: str, schema: str
) -> None:
    """README: "Worker connections use TCP keepalives, a TCP user timeout and
    idle_in_transaction_session_timeout", and a process handler's child has
    ``job.transaction()`` and ``job.connection()`` "on the child's own
    connections". Those had none of the worker's session settings: a child's
    transaction left open (its worker's host cut off from the database) kept its
    locks, the job's row among them, until the server's TCP keepalive gave up
    (hours by default), where a thread handler's is ended after a minute."""
    app = leaseq.App(schema=schema)
    app.task("threaded")(session_settings)
    app.task("in_process", executor="process")(session_settings)
    threaded = queue.enqueue("threaded", {})
    in_process = queue.enqueue("in_process", {})
    stats = drain(app, dsn=database_url, concurrency=2)
    assert stats.completed == 2
    assert queue.result(threaded) == {"connection": "1min", "transaction": "1min"}
    assert queue.result(in_process) == queue.result(threaded)


#: A worker's hand-over, then its death at once: a child is spawned for a claim,
#: given it, and its worker dies while the child is still starting.
_DIES_DURING_THE_CHILDS_START = """
import multiprocessing, os, sys
import leaseq
from leaseq._worker.process_child import child_main
from leaseq._worker.processes import ProcessPool

schema, dsn = sys.argv[1], sys.argv[2]
handler = sys.argv[3] if len(sys.argv) > 3 else "stubborn"
with leaseq.Queue(dsn, schema=schema) as queue:
    (claim,) = queue.claim(handler, lease=300)
pool = ProcessPool(1, dsn, schema)
child = pool._spawn()
child.pipe.send(("tests.process_app", handler, claim, None, 1 << 20))
os._exit(0)  # before the child, still importing, has run a line of its own
"""


@pytest.mark.server_agnostic  # the child processes' lifecycle
def test_a_child_whose_worker_died_while_it_started_leaves_too(
    tables: leaseq.Queue, database_url: str, schema: str
) -> None:
    """The worker killed in the second its new child spends starting (right after
    handing it a job): the child looked for its parent only once started, found
    the process that adopted it, took that for its worker, and ran its handler
    on, unsupervised, beside the job's next attempt (for ever, one that never
    returns)."""
    queue = tables
    queue.enqueue("stubborn", {"schema": schema})  # its first attempt never returns
    subprocess.run(
        [sys.executable, "-c", _DIES_DURING_THE_CHILDS_START, schema, database_url],
        cwd=ROOT,
        check=True,
        timeout=60,
    )
    deadline = time.monotonic() + 60
    while not (started := _rows(queue, "SELECT pid FROM {schema}.seen WHERE what = 'started'")):
        assert time.monotonic() < deadline, "the handler never started"
        time.sleep(0.05)
    ((child,),) = started
    try:
        assert _still_running([child], within=processes.KILL_AFTER + 10) == []
        assert _rows(queue, "SELECT what FROM {schema}.seen WHERE what = 'still alive'") == []
    finally:
        _kill_all([child])


@pytest.mark.server_agnostic  # the child processes' lifecycle
def test_an_orphaned_child_whose_handler_answers_leaves_without_a_traceback(
    tables: leaseq.Queue, database_url: str, schema: str
) -> None:
    """Told that its worker is gone, the handler returns: its answer has nowhere
    to go. The child printed a BrokenPipeError's traceback, read in a log as a
    crash of the worker."""
    queue = tables
    job_id = queue.enqueue("polite", {"schema": schema})  # returns once told
    helper = subprocess.run(
        [sys.executable, "-c", _DIES_DURING_THE_CHILDS_START, schema, database_url, "polite"],
        cwd=ROOT,
        capture_output=True,  # (the child's too: read until the child is gone)
        text=True,
        check=True,
        timeout=60,
    )
    assert "Traceback" not in helper.stderr, helper.stderr
    assert _rows(queue, "SELECT what FROM {schema}.seen") == [("started",), ("told",)]
    # Told, its attempt is lost: its completion refused, the job left to its lease.
    assert queue.get(job_id).status is JobStatus.RUNNING


def test_on_success_sees_the_result_a_childs_completion_stored(
    queue: leaseq.Queue, database_url: str, schema: str
) -> None:
    """The hooks are told the result the child's job.transaction() stored, not
    the ``job.result`` it set afterwards (which the job does not have)."""
    seen: list[Any] = []
    app = leaseq.App(schema=schema)
    app.on_success(lambda job, result: seen.append(result))
    app.task("completes_then_changes_its_result", executor="process")(
        process_app.completes_then_changes_its_result
    )
    job_id = queue.enqueue("completes_then_changes_its_result", {})
    drain(app, dsn=database_url, timeout=60)
    assert queue.result(job_id) == "committed"
    assert seen == ["committed"]
