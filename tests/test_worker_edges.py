"""Edge paths of the worker runtime, each against the real database: what a handler
may raise, what a handler's process may be sent, how a stop ends."""

from __future__ import annotations

import asyncio
import contextlib
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import psycopg
import pytest

import leaseq
from leaseq import JobStatus
from leaseq._worker import runner
from leaseq._worker.context import JobContext
from leaseq.testing import adrain

from .conftest import AsyncClock, SpareDatabase
from .frozen_proxy import frozen_proxy
from .roles import restricted_roles
from .scripts import run_script

pytestmark = pytest.mark.asyncio


class OwnBaseException(BaseException):
    """Not an Exception: what some libraries raise to unwind."""


def _raise_system_exit() -> None:
    sys.exit(2)  # argparse's parser.error does this


def _raise_keyboard_interrupt() -> None:
    raise KeyboardInterrupt


def _raise_own_base_exception() -> None:
    raise OwnBaseException("unwound")


def _raise_stop_iteration() -> None:
    next(iter(()))  # a next() on an exhausted iterator, outside any generator


async def _await_something_cancelled() -> None:
    inner = asyncio.ensure_future(asyncio.sleep(10))
    inner.cancel()
    await inner  # raises CancelledError in the handler: not the worker's cancellation


RAISERS: dict[str, Callable[[], Any]] = {
    "system_exit": _raise_system_exit,
    "keyboard_interrupt": _raise_keyboard_interrupt,
    "own_base_exception": _raise_own_base_exception,
    # A Future refuses StopIteration as an exception: a sync handler's went nowhere,
    # and its job stayed running, renewed, for ever.
    "stop_iteration": _raise_stop_iteration,
}


@pytest.mark.parametrize(
    ("kind", "raised"),
    [
        *[(kind, raised) for kind in ("sync", "async") for raised in RAISERS],
        ("async", "cancelled_error"),  # a sync handler has nothing cancelled to await
    ],
)
async def test_a_handler_that_raises_what_is_not_an_exception_is_retried_and_the_worker_goes_on(
    aqueue: leaseq.AsyncQueue, database_url: str, schema: str, kind: str, raised: str
) -> None:
    """Its first attempt raised; the job runs again and completes, and the worker
    neither dies nor leaves the job running."""
    app = leaseq.App(schema=schema)

    if kind == "sync":

        @app.task("work", backoff=(0, 0), max_attempts=3)
        def sync_handler(job: leaseq.JobContext) -> str:
            if job.attempts == 1:
                RAISERS[raised]()
            return "ok"

    else:

        @app.task("work", backoff=(0, 0), max_attempts=3)
        async def async_handler(job: leaseq.JobContext) -> str:
            if job.attempts == 1:
                if raised == "cancelled_error":
                    await _await_something_cancelled()
                else:
                    RAISERS[raised]()
            return "ok"

    ids = await aqueue.enqueue_many("work", [{} for _ in range(3)])
    worker = leaseq.Worker(app, dsn=database_url, concurrency=3, poll_interval=0.1)
    await asyncio.wait_for(worker.run(burst=True), 60)
    for job_id in ids:
        job = await aqueue.get(job_id)
        assert (job.status, job.attempts) == (JobStatus.DONE, 2), job.history
        assert await aqueue.result(job_id) == "ok"
        assert job.history[0]["outcome"] == "retry"
    assert (worker.stats.retried, worker.stats.completed) == (3, 3)


# -- stopping ---------------------------------------------------------------------------


def _deaf_app(schema: str) -> tuple[leaseq.App, asyncio.Event, asyncio.Event]:
    """An app whose "work" handler swallows every cancellation until told to stop
    (the second event); the first says it started."""
    app = leaseq.App(schema=schema)
    started = asyncio.Event()
    stop_deafness = asyncio.Event()

    @app.task("work")
    async def deaf(job: leaseq.JobContext) -> None:
        started.set()
        while not stop_deafness.is_set():
            with contextlib.suppress(BaseException):
                await asyncio.sleep(0.05)

    return app, started, stop_deafness


async def test_a_handler_deaf_to_cancellation_cannot_keep_a_stopping_worker(
    aqueue: leaseq.AsyncQueue, database_url: str, schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """It swallows every cancellation: run() still returns (after the grace and the
    releases' bounded wait), leaving the job to its lease, never acknowledged."""
    monkeypatch.setattr(runner, "ACKNOWLEDGEMENT_WAIT", 1.0)
    app, started, stop_deafness = _deaf_app(schema)

    job_id = await aqueue.enqueue("work", {})
    worker = leaseq.Worker(
        app, dsn=database_url, concurrency=1, poll_interval=0.1, shutdown_grace=0.5
    )
    running = asyncio.create_task(worker.run())
    await asyncio.wait_for(started.wait(), 30)
    worker.request_stop()
    done, _ = await asyncio.wait({running}, timeout=60)
    stop_deafness.set()  # it returns now, late: nothing waits for its outcome
    await asyncio.sleep(0.3)
    assert done, "the worker did not stop"
    running.result()
    job = await aqueue.get(job_id)
    assert (job.status, job.attempts) == (JobStatus.RUNNING, 1)  # to its lease's expiry


async def test_a_handler_deaf_to_cancellation_is_left_after_a_second_not_the_releases_wait(
    aqueue: leaseq.AsyncQueue,
    database_url: str,
    schema: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The README: "the worker cancels it, waits a second more, then leaves it". It
    waited the releases' whole 10 seconds first, then blamed the database."""
    app, started, stop_deafness = _deaf_app(schema)

    @app.task("polite")
    async def polite(job: leaseq.JobContext) -> None:
        await asyncio.sleep(3600)

    deaf_id = await aqueue.enqueue("work", {})
    polite_id = await aqueue.enqueue("polite", {})
    worker = leaseq.Worker(
        app, dsn=database_url, concurrency=2, poll_interval=0.1, shutdown_grace=0.5
    )
    running = asyncio.create_task(worker.run())
    await asyncio.wait_for(started.wait(), 30)
    while (await aqueue.get(polite_id)).status is not JobStatus.RUNNING:
        await asyncio.sleep(0.05)
    stopped_at = time.monotonic()
    worker.request_stop()
    try:
        await asyncio.wait_for(asyncio.shield(running), 30)
        waited = time.monotonic() - stopped_at
    finally:
        stop_deafness.set()
    # The grace, a second for the deaf one; not runner.ACKNOWLEDGEMENT_WAIT (10 s).
    assert waited < runner.ACKNOWLEDGEMENT_WAIT - 2, waited
    assert "did not stop when cancelled" in caplog.text
    assert "is the database reachable" not in caplog.text
    assert (await aqueue.get(deaf_id)).status is JobStatus.RUNNING  # to its lease's expiry
    polite_job = await aqueue.get(polite_id)  # released, its attempt not counted
    assert (polite_job.status, polite_job.attempts) == (JobStatus.QUEUED, 0)


MALFORMED_URL = "postgresql://app:Sekr1t@127.0.0.1:5432/app?bogus_option=1"


@pytest.mark.parametrize("which", ["dsn", "listen_dsn"])
async def test_a_worker_stops_on_a_database_url_no_connection_can_be_made_with(
    aqueue: leaseq.AsyncQueue, database_url: str, schema: str, which: str
) -> None:
    """Its claims' URL, or its LISTEN URL alone: trying again cannot mend it. The
    LISTEN session's raw driver error crashed the worker with a traceback ("a
    worker service crashed"); the claims retried it for ever."""
    app = leaseq.App(schema=schema)

    @app.task("work")
    async def handler(job: leaseq.JobContext) -> None:
        pass

    urls = {"dsn": database_url, "listen_dsn": database_url, which: MALFORMED_URL}
    worker = leaseq.Worker(app, concurrency=1, poll_interval=0.1, **urls)
    with pytest.raises(leaseq.InvalidDatabaseURL) as stopped:
        await asyncio.wait_for(worker.run(), 60)
    assert "Sekr1t" not in str(stopped.value)


async def test_maintenance_stops_on_a_database_url_no_connection_can_be_made_with() -> None:
    async with leaseq.AsyncQueue(MALFORMED_URL) as queue:
        with pytest.raises(leaseq.InvalidDatabaseURL):
            await asyncio.wait_for(leaseq.Maintenance(queue, interval=0.1).run(), 60)


async def test_a_stop_with_the_database_away_ends_and_leaves_the_jobs_to_their_leases(
    spare_database: SpareDatabase, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The releases cannot be sent: the worker still stops (after its grace and a
    bounded wait for them), and the jobs stay running until their leases expire."""
    spare_database.create()
    async with leaseq.AsyncQueue(spare_database.dsn) as queue:
        await queue.migrate()
        ids = await queue.enqueue_many("work", [{}, {}])
    monkeypatch.setattr(runner, "ACKNOWLEDGEMENT_WAIT", 1.0)
    app = leaseq.App()
    started: list[int] = []

    @app.task("work")
    async def handler(job: leaseq.JobContext) -> None:
        started.append(job.job_id)
        await asyncio.sleep(3600)

    worker = leaseq.Worker(
        app, dsn=spare_database.dsn, concurrency=2, poll_interval=0.1, shutdown_grace=0.5
    )
    running = asyncio.create_task(worker.run())
    deadline = time.monotonic() + 30
    while len(started) < 2:
        assert time.monotonic() < deadline
        assert not running.done()
        await asyncio.sleep(0.05)
    spare_database.refuse_connections()
    worker.request_stop()
    done, _ = await asyncio.wait({running}, timeout=90)
    assert done, "the worker did not stop while its database was away"
    spare_database.accept_connections()
    async with leaseq.AsyncQueue(spare_database.dsn) as queue:
        for job_id in ids:
            job = await queue.get(job_id)
            assert job.status is JobStatus.RUNNING  # its lease runs on; then it is recovered


async def test_a_stop_that_arrives_while_a_claim_is_in_flight_releases_what_it_claimed(
    aqueue: leaseq.AsyncQueue, database_url: str, schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With no grace, the claim's attempts are released at once: none stays claimed
    by a worker that is gone."""
    app = leaseq.App(schema=schema)

    @app.task("work")
    async def handler(job: leaseq.JobContext) -> None:
        await asyncio.sleep(3600)

    ids = await aqueue.enqueue_many("work", [{}, {}, {}])
    worker = leaseq.Worker(
        app, dsn=database_url, concurrency=3, poll_interval=0.1, lease=60, shutdown_grace=0
    )
    claim = leaseq.AsyncQueue.claim

    async def claim_then_stop(self: leaseq.AsyncQueue, *args: Any, **kwargs: Any) -> Any:
        claims = await claim(self, *args, **kwargs)
        if claims:
            worker.request_stop()  # the signal came while the claim was on its way
        return claims

    monkeypatch.setattr(leaseq.AsyncQueue, "claim", claim_then_stop)
    await asyncio.wait_for(worker.run(), 60)
    jobs = [await aqueue.get(job_id) for job_id in ids]
    assert [job.status for job in jobs] == [JobStatus.QUEUED] * 3, [job.history for job in jobs]
    assert worker.stats.released == 3


# -- the handlers' connections ------------------------------------------------------------


async def test_every_sync_handler_may_take_a_connection_inside_its_transaction_at_once(
    aqueue: leaseq.AsyncQueue, database_url: str, schema: str
) -> None:
    """All slots busy, each handler holding its job.transaction() and asking for a
    job.connection() (an audit row, say): none waits for another's connection."""
    app = leaseq.App(schema=schema)
    concurrency = 3
    inside = threading.Barrier(concurrency, timeout=20)

    @app.task("work")
    def handler(job: leaseq.JobContext) -> None:
        with job.transaction() as conn:
            conn.execute("SELECT 1")
            inside.wait()  # every slot holds its transaction now
            with job.connection() as other:
                other.execute("SELECT 1")

    ids = await aqueue.enqueue_many("work", [{} for _ in range(concurrency)])
    worker = leaseq.Worker(app, dsn=database_url, concurrency=concurrency, poll_interval=0.1)
    await asyncio.wait_for(worker.run(burst=True), 120)
    jobs = [await aqueue.get(job_id) for job_id in ids]
    assert [(job.status, job.attempts) for job in jobs] == [(JobStatus.DONE, 1)] * concurrency, [
        job.history for job in jobs
    ]


async def test_every_async_handler_may_hold_its_transaction_at_once(
    aqueue: leaseq.AsyncQueue, database_url: str, schema: str
) -> None:
    app = leaseq.App(schema=schema)
    concurrency = 8
    holding = 0
    everyone = asyncio.Event()

    @app.task("work")
    async def handler(job: leaseq.JobContext) -> None:
        nonlocal holding
        async with job.atransaction() as conn:
            await conn.execute("SELECT 1")
            holding += 1
            if holding == concurrency:
                everyone.set()
            await asyncio.wait_for(everyone.wait(), 20)

    ids = await aqueue.enqueue_many("work", [{} for _ in range(concurrency)])
    worker = leaseq.Worker(app, dsn=database_url, concurrency=concurrency, poll_interval=0.1)
    await asyncio.wait_for(worker.run(burst=True), 120)
    jobs = [await aqueue.get(job_id) for job_id in ids]
    assert [(job.status, job.attempts) for job in jobs] == [(JobStatus.DONE, 1)] * concurrency, [
        job.history for job in jobs
    ]


# -- job.transaction() used twice ---------------------------------------------------------


@pytest.fixture
def effects(aqueue: leaseq.AsyncQueue, schema: str) -> Callable[[], Any]:
    """``effects()``: the rows the handlers wrote to the test's ``effect`` table."""
    table = f'"{schema}".effect'

    async def read() -> list[str]:
        async with aqueue.connection() as conn:
            rows = await (await conn.execute(f"SELECT what FROM {table} ORDER BY what")).fetchall()
        return [row[0] for row in rows]

    return read


@pytest.mark.parametrize("kind", ["sync", "async"])
async def test_a_nested_job_transaction_is_refused_and_nothing_half_commits(
    aqueue: leaseq.AsyncQueue,
    database_url: str,
    schema: str,
    kind: str,
    effects: Callable[[], Any],
) -> None:
    """A nested block would complete the job on its own; the outer block's
    completion would then be refused and its writes rolled back, the job done."""
    async with aqueue.connection() as conn:
        await conn.execute(f'CREATE TABLE "{schema}".effect (what text)')
    insert = f'INSERT INTO "{schema}".effect VALUES (%s)'
    app = leaseq.App(schema=schema)

    if kind == "sync":

        @app.task("work")
        def sync_handler(job: leaseq.JobContext) -> None:
            with job.transaction() as outer:
                outer.execute(insert, ("order row",))
                with job.transaction() as inner:
                    inner.execute(insert, ("audit row",))

    else:

        @app.task("work")
        async def async_handler(job: leaseq.JobContext) -> None:
            async with job.atransaction() as outer:
                await outer.execute(insert, ("order row",))
                async with job.atransaction() as inner:
                    await inner.execute(insert, ("audit row",))

    job_id = await aqueue.enqueue("work", {})
    await asyncio.wait_for(
        leaseq.Worker(app, dsn=database_url, poll_interval=0.1).run(burst=True), 60
    )
    job = await aqueue.get(job_id)
    assert job.status is JobStatus.FAILED  # a mistake in the handler, said at once
    assert "already open" in job.history[-1]["error"]
    assert await effects() == []  # neither block committed


# -- a crash loop ---------------------------------------------------------------------------


async def test_a_job_whose_workers_keep_dying_stops_at_its_tasks_attempts(
    aqueue: leaseq.AsyncQueue, aclock: AsyncClock, database_url: str, schema: str
) -> None:
    """Its task allows 2 attempts (the queue 20): the workers of both died with the
    job (their leases expired). The third claim fails it, without running it."""
    app = leaseq.App(schema=schema)
    ran: list[int] = []

    @app.task("work", max_attempts=2)
    async def handler(job: leaseq.JobContext) -> None:
        ran.append(job.attempts)

    job_id = await aqueue.enqueue("work", {})
    for _ in range(2):  # claimed, then its worker dies: the lease runs out
        assert len(await aqueue.claim("work", lease=10)) == 1
        await aclock.advance(11)
    await asyncio.wait_for(
        leaseq.Worker(app, dsn=database_url, poll_interval=0.1).run(burst=True), 60
    )
    job = await aqueue.get(job_id)
    assert ran == []
    assert (job.status, job.attempts) == (JobStatus.FAILED, 3)
    assert "no attempts left" in job.history[-1]["error"]


async def test_a_renewal_refused_because_the_handler_completed_the_job_is_no_lost_lease(
    aqueue: leaseq.AsyncQueue,
    database_url: str,
    schema: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The handler's job.transaction() committed; before the worker hears of it, a
    renewal comes back refused (the job is done). That is a completion, not a lost
    lease: no warning, no lost-lease count, no job.lost for the rest of the handler."""
    mark_completed = JobContext.mark_completed

    def heard_late(context: JobContext) -> None:
        time.sleep(1.0)  # the thread descheduled between its commit and this
        mark_completed(context)

    monkeypatch.setattr(JobContext, "mark_completed", heard_late)
    app = leaseq.App(schema=schema)
    told: list[bool] = []

    @app.task("work", lease=0.6)  # renewed every 0.2 s: several fall in that second
    def handler(job: leaseq.JobContext) -> None:
        with job.transaction() as conn:
            conn.execute("SELECT 1")
        told.append(job.lost.is_set())

    job_id = await aqueue.enqueue("work", {})
    worker = leaseq.Worker(app, dsn=database_url, poll_interval=0.1)
    await asyncio.wait_for(worker.run(burst=True), 60)
    assert (await aqueue.get(job_id)).status is JobStatus.DONE
    assert (worker.stats.lost_leases, worker.stats.completed) == (0, 1)
    assert told == [False]


# -- callables whose call is async ----------------------------------------------------------


async def test_a_handler_and_hooks_whose_call_is_async_are_awaited(
    aqueue: leaseq.AsyncQueue, database_url: str, schema: str
) -> None:
    """Objects with an ``async def __call__`` (a class-based handler, a hook with
    state): run as plain calls in a thread, their coroutines were never awaited."""
    seen: list[str] = []

    class Handler:
        async def __call__(self, job: leaseq.JobContext) -> str:
            await asyncio.sleep(0)
            seen.append("handler")
            return "ran"

    class Hook:
        def __init__(self, name: str) -> None:
            self.name = name

        async def __call__(self, job: leaseq.JobContext, *args: Any) -> None:
            await asyncio.sleep(0)
            seen.append(self.name)

    app = leaseq.App(schema=schema)
    app.task("work")(Handler())
    app.before_job(Hook("before"))
    app.on_success(Hook("success"))
    job_id = await aqueue.enqueue("work", {})
    await asyncio.wait_for(
        leaseq.Worker(app, dsn=database_url, poll_interval=0.1).run(burst=True), 60
    )
    assert await aqueue.result(job_id) == "ran"
    assert seen == ["before", "handler", "success"]


async def test_notifications_that_are_no_job_id_leave_the_worker_running(
    aqueue: leaseq.AsyncQueue, database_url: str, schema: str
) -> None:
    """Any role that may connect may NOTIFY on the schema's channel: what it sends
    is a hint at most, and a hint the worker cannot read is ignored. "!lost"
    followed by a digit int() refuses (a superscript), by more digits than int()
    reads, or by a number past bigint, must not stop the worker."""
    app = leaseq.App(schema=schema)
    done: list[int] = []

    @app.task("work")
    async def handler(job: leaseq.JobContext) -> None:
        done.append(job.payload["n"])

    worker = leaseq.Worker(app, dsn=database_url, concurrency=2, poll_interval=0.2)
    running = asyncio.create_task(worker.run())
    try:
        await aqueue.enqueue("work", {"n": 1})
        deadline = time.monotonic() + 30
        while done != [1]:
            assert time.monotonic() < deadline
            assert not running.done()
            await asyncio.sleep(0.05)
        async with aqueue.connection() as conn:
            for payload in ("!lost ²", "!lost " + "9" * 5000, "!lost 99999999999999999999", "!"):
                await conn.execute("SELECT pg_notify(%s, %s)", (aqueue._store.channel, payload))
        await asyncio.sleep(0.5)  # heard by now
        await aqueue.enqueue("work", {"n": 2})
        while done != [1, 2]:
            assert not running.done(), running.exception()
            assert time.monotonic() < deadline
            await asyncio.sleep(0.05)
    finally:
        worker.request_stop()
        await asyncio.wait_for(running, 30)


async def test_a_job_released_while_its_sync_handler_runs_on_never_runs_twice_at_once(
    aqueue: leaseq.AsyncQueue, database_url: str, schema: str
) -> None:
    """A stop releases a sync handler's job while its thread runs on (it cannot be
    stopped; it looks at job.lost once a second). Another worker must not start the
    job beside it: the released job waits until the lease it held would have ended."""
    app = leaseq.App(schema=schema)
    spans: list[list[float]] = []
    started = threading.Event()

    @app.task("slow", lease=3.0)
    def slow(job: leaseq.JobContext) -> None:
        span = [time.monotonic()]
        spans.append(span)
        started.set()
        while len(spans) == 1:  # looks at job.lost only once a second
            time.sleep(1.0)
            if job.lost.is_set():
                break
        span.append(time.monotonic())

    job_id = await aqueue.enqueue("slow", {}, key="k")
    first = leaseq.Worker(app, dsn=database_url, poll_interval=0.1, shutdown_grace=0.2)
    first_run = asyncio.create_task(first.run())
    await asyncio.wait_for(asyncio.to_thread(started.wait, 30), 35)
    second = leaseq.Worker(app, dsn=database_url, poll_interval=0.1)
    second_run = asyncio.create_task(second.run())
    first.request_stop()
    await asyncio.wait_for(first_run, 30)
    deadline = time.monotonic() + 30
    while not (len(spans) == 2 and all(len(span) == 2 for span in spans)):
        assert time.monotonic() < deadline, spans
        await asyncio.sleep(0.05)
    second.request_stop()
    await asyncio.wait_for(second_run, 30)
    (first_start, first_end), (second_start, _) = spans
    assert first_end <= second_start, f"ran twice at once for {first_end - second_start:.2f}s"
    job = await aqueue.get(job_id)
    assert (job.status, job.attempts) == (JobStatus.DONE, 1)  # the release counted none
    assert [entry["outcome"] for entry in job.history] == ["released"]
    del first_start


async def test_a_job_whose_sync_handler_is_deaf_at_the_stop_waits_for_its_lease(
    aqueue: leaseq.AsyncQueue, database_url: str, schema: str
) -> None:
    """A sync handler that never looks at job.lost still ran a second after the
    stop, yet its job (and its key's next one) was released claimable at once:
    the release that knew its thread ran on was replaced by a plain one."""
    app = leaseq.App(schema=schema)
    started, may_end, ended = threading.Event(), threading.Event(), threading.Event()

    @app.task("deaf", lease=30.0)
    def deaf(job: leaseq.JobContext) -> None:
        started.set()
        may_end.wait(30)  # deaf to job.lost
        ended.set()

    job_id = await aqueue.enqueue("deaf", {}, key="k", seq=1)
    await aqueue.enqueue("deaf", {}, key="k", seq=2)
    worker = leaseq.Worker(app, dsn=database_url, poll_interval=0.1, shutdown_grace=0.2)
    running = asyncio.create_task(worker.run())
    try:
        await asyncio.wait_for(asyncio.to_thread(started.wait, 30), 35)
        worker.request_stop()
        await asyncio.wait_for(running, 30)
        assert not ended.is_set()  # its thread runs on
        assert await aqueue.claim("deaf", limit=10) == []  # neither it nor its key's next
        job = await aqueue.get(job_id)
        assert (job.status, job.attempts) == (JobStatus.QUEUED, 0)
    finally:
        may_end.set()


async def test_a_sync_handler_that_stops_when_told_has_its_job_claimable_at_once(
    aqueue: leaseq.AsyncQueue, database_url: str, schema: str
) -> None:
    """The README's own handler returns once job.lost is set. Its job was released
    as if its thread ran on: no worker could take it until the lease it held would
    have ended (a minute here), after every deploy."""
    app = leaseq.App(schema=schema)
    ran: list[str] = []
    started = threading.Event()

    @app.task("slow", lease=60.0)
    def slow(job: leaseq.JobContext) -> str:
        started.set()
        while not job.lost.is_set():
            time.sleep(0.02)
        ran.append("stopped when told")
        return "partial"  # returned because told: not a result

    job_id = await aqueue.enqueue("slow", {})
    worker = leaseq.Worker(app, dsn=database_url, poll_interval=0.1, shutdown_grace=0.2)
    running = asyncio.create_task(worker.run())
    await asyncio.wait_for(asyncio.to_thread(started.wait, 30), 35)
    worker.request_stop()
    await asyncio.wait_for(running, 30)
    assert ran == ["stopped when told"]
    job = await aqueue.get(job_id)
    assert (job.status, job.attempts) == (JobStatus.QUEUED, 0), job.history
    (claim,) = await aqueue.claim("slow")  # at once: no thread of it runs on
    assert claim.job_id == job_id
    assert worker.stats.released == 1
    assert worker.stats.completed == 0


async def test_a_sync_handler_stopped_inside_its_transaction_has_its_job_released(
    aqueue: leaseq.AsyncQueue, database_url: str, schema: str
) -> None:
    """The README's pattern, job.transaction(), cut by the stop: leaving the block,
    its completion is refused (job.lost is set: LeaseLost of its own claim) and its
    effect rolls back. The job was taken for a lost lease: nothing written, left
    running until its lease ran out, the interrupted attempt counted (with
    max_attempts=1 the reaper then failed it: one deploy, a job failed for good).
    The lease is the worker's still: the job is released, claimable at once."""
    app = leaseq.App(schema=schema)
    started = threading.Event()
    left: list[str] = []

    @app.task("reports", lease=60.0)
    def write_report(job: leaseq.JobContext) -> None:
        try:
            with job.transaction() as conn:
                conn.execute("SELECT 1")
                started.set()
                job.lost.wait(30)  # still writing its effect when the stop comes
        except leaseq.LeaseLost as exc:
            left.append(type(exc).__name__)
            raise

    job_id = await aqueue.enqueue("reports", {}, max_attempts=1)
    worker = leaseq.Worker(
        app, dsn=database_url, poll_interval=0.1, shutdown_grace=0.2, maintenance=False
    )
    running = asyncio.create_task(worker.run())
    await asyncio.wait_for(asyncio.to_thread(started.wait, 30), 35)
    worker.request_stop()
    await asyncio.wait_for(running, 30)
    assert left == ["LeaseLost"]  # its block's completion was refused: nothing committed
    job = await aqueue.get(job_id)
    assert (job.status, job.attempts) == (JobStatus.QUEUED, 0), job.history
    (claim,) = await aqueue.claim("reports")  # at once, its one attempt still to come
    assert claim.job_id == job_id
    assert (worker.stats.released, worker.stats.lost_leases) == (1, 0)


@pytest.mark.parametrize(
    "option",
    [
        {"poll_interval": 0},
        {"poll_interval": -1},
        {"poll_interval": float("nan")},
        {"poll_interval": "1"},
        {"shutdown_grace": -1},
        {"shutdown_grace": float("inf")},
        {"maintenance_interval": 0},
        {"maintenance_interval": float("nan")},
        {"lease": -5},
        # Each failed later, in run(), or with a TypeError.
        {"concurrency": 1.5},
        {"concurrency": "2"},
        {"concurrency": 0},
        {"concurrency": True},
        {"renew_fraction": "x"},
        {"renew_fraction": float("nan")},
        {"renew_fraction": 1},
        {"listen_dsn": 5},
        {"dsn": 5},
        {"queues": "work"},
        {"queues": ["work", 5]},
        # A TypeError; and [] served every queue of the app (read as `queues or
        # app.tasks`), not the none it names.
        {"queues": 5},
        {"queues": []},
        {"listen": "no"},
        {"maintenance": 0},
        {"durable_acknowledgements": None},
        # Failed in run() with an AttributeError.
        {"metrics": "registry"},
    ],
    ids=repr,
)
async def test_bad_worker_options_are_refused(schema: str, option: dict[str, Any]) -> None:
    """A poll interval of 0 or less claimed in a busy loop, and a burst never ended."""
    app = leaseq.App(schema=schema)
    app.task("work")(lambda job: None)
    arguments = {"dsn": "postgresql://nobody@127.0.0.1:1/none", **option}
    with pytest.raises(leaseq.InvalidArgument, match=next(iter(option))):
        leaseq.Worker(app, **arguments)


async def test_a_worker_reads_the_queues_it_is_given_once(
    aqueue: leaseq.AsyncQueue, database_url: str, schema: str
) -> None:
    """Any iterable of names is taken, a generator too. The check used to walk
    it and the worker then read it again, used up: it served no queue, its run()
    failed with a ZeroDivisionError and the jobs stayed queued (drain() alike)."""
    app = leaseq.App(schema=schema)
    ran: list[int] = []
    for name in ("emails", "reports"):
        app.task(name)(lambda job: ran.append(job.job_id))
    worker = leaseq.Worker(app, dsn=database_url, queues=iter(["emails", "emails"]))
    assert worker.queues == ["emails"]  # (a name given twice is asked once per turn)
    job_id = await aqueue.enqueue("emails", {})
    other = await aqueue.enqueue("reports", {})
    stats = await adrain(app, dsn=database_url, queues=(name for name in ["emails"]))
    assert (stats.completed, ran) == (1, [job_id])
    assert (await aqueue.get(job_id)).status is JobStatus.DONE
    assert (await aqueue.get(other)).status is JobStatus.QUEUED
    with pytest.raises(leaseq.InvalidArgument, match="queues is empty"):
        leaseq.Worker(app, dsn=database_url, queues=(name for name in ()))
    # (a DSN given as a queue by mistake: its password stays out of the error)
    with pytest.raises(leaseq.InvalidArgument, match="no handler") as refused:
        leaseq.Worker(app, dsn=database_url, queues=["postgresql://u:hunter2@db/app"])
    assert "hunter2" not in str(refused.value)


async def test_a_handler_or_hook_that_cannot_be_called_is_refused_where_declared(
    schema: str,
) -> None:
    """Accepted, it failed every attempt of every job with a TypeError."""
    app = leaseq.App(schema=schema)

    class Mailer:  # no __call__
        pass

    with pytest.raises(leaseq.InvalidArgument, match="callable"):
        app.task("emails")(Mailer())  # type: ignore[type-var]
    assert "emails" not in app.tasks
    for declare in (app.before_job, app.around_job, app.on_success, app.on_failure):
        with pytest.raises(leaseq.InvalidArgument, match="callable"):
            declare(None)  # type: ignore[arg-type]
    with pytest.raises(leaseq.InvalidArgument, match="dsn"):
        leaseq.App(5)  # type: ignore[arg-type]


@pytest.mark.parametrize("app", [None, "tests.worker_app:app", leaseq.Queue], ids=repr)
async def test_a_worker_wants_an_app(app: Any) -> None:
    """None raised an AttributeError (app.tasks)."""
    with pytest.raises(leaseq.InvalidArgument, match="App"):
        leaseq.Worker(app, dsn="postgresql://nobody@127.0.0.1:1/none")


async def test_a_cancelled_run_stops_its_handlers_and_gives_their_jobs_back(
    aqueue: leaseq.AsyncQueue, database_url: str, schema: str
) -> None:
    """An application cancels Worker.run() (its lifespan ends, a TaskGroup, Ctrl-C on
    asyncio.run): nothing renews the running jobs' leases from then on. Their
    handlers were left running, and another worker started the same jobs at
    their lease's end, beside them. Now they are stopped and their jobs given back."""
    app = leaseq.App(schema=schema)
    started = {"async": asyncio.Event(), "sync": threading.Event()}
    cancelled: list[str] = []
    told: list[str] = []

    @app.task("slow_async", lease=60)
    async def slow_async(job: leaseq.JobContext) -> None:
        started["async"].set()
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            cancelled.append("async")
            raise

    @app.task("slow_sync", lease=60)
    def slow_sync(job: leaseq.JobContext) -> None:
        started["sync"].set()
        if job.lost.wait(60):
            told.append("sync")

    async_id = await aqueue.enqueue("slow_async", {})
    sync_id = await aqueue.enqueue("slow_sync", {})
    worker = leaseq.Worker(app, dsn=database_url, concurrency=2, maintenance=False)
    running = asyncio.create_task(worker.run())
    await asyncio.wait_for(started["async"].wait(), 30)
    await asyncio.wait_for(asyncio.to_thread(started["sync"].wait, 30), 35)
    running.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(running, 30)
    assert cancelled == ["async"]
    assert told == ["sync"]
    for job_id in (async_id, sync_id):
        job = await aqueue.get(job_id)
        assert (job.status, job.attempts) == (JobStatus.QUEUED, 0), job.history
    claims = await aqueue.claim("slow_async", limit=1)
    assert [c.job_id for c in claims] == [async_id]  # at once: its handler stopped


async def test_a_worker_runs_once(
    aqueue: leaseq.AsyncQueue, database_url: str, schema: str
) -> None:
    """A second run() (a second drain in a test, a cron loop) claimed a job, then
    crashed on its first run's loop-bound state, the job left running."""
    app = leaseq.App(schema=schema)
    app.task("work")(lambda job: None)
    worker = leaseq.Worker(app, dsn=database_url, maintenance=False)
    await worker.run(burst=True)
    job_id = await aqueue.enqueue("work", {})
    with pytest.raises(RuntimeError, match="runs once"):
        await worker.run(burst=True)
    job = await aqueue.get(job_id)
    assert (job.status, job.attempts) == (JobStatus.QUEUED, 0)


async def test_a_claim_refused_for_good_stops_the_worker_as_a_signal_does(
    queue: leaseq.Queue, database_url: str, schema: str
) -> None:
    """A grant revoked while a job runs: the claims are refused (42501). The worker
    used to end at once, its running job neither finished nor given back (left
    running until its lease ran out). It stops as on a signal: the job finishes."""
    first = queue.enqueue("work", {})
    app = leaseq.App(schema=schema)
    started = asyncio.Event()

    @app.task("work")
    async def work(job: leaseq.JobContext) -> None:
        started.set()
        await asyncio.sleep(1.5)

    with restricted_roles(database_url, schema) as roles:
        worker = leaseq.Worker(
            app, dsn=roles.worker, poll_interval=0.1, maintenance=False, shutdown_grace=10
        )
        running = asyncio.create_task(worker.run())
        await asyncio.wait_for(started.wait(), 30)
        worker_role = psycopg.conninfo.conninfo_to_dict(roles.worker)["user"]
        with psycopg.connect(database_url, autocommit=True) as admin:
            admin.execute(f'REVOKE SELECT ON "{schema}".queue FROM {worker_role}')
        queue.enqueue("work", {})  # what the next claim is for
        with pytest.raises(leaseq.DatabaseError) as refused:
            await asyncio.wait_for(running, 30)
    assert refused.value.sqlstate == "42501"
    assert queue.get(first).status is JobStatus.DONE


async def test_a_stop_during_the_start_waits_no_longer_than_its_grace(
    aqueue: leaseq.AsyncQueue, database_url: str, schema: str
) -> None:
    """A deploy's `leaseq migrate` holds the schema's migration table while a
    worker starts: its schema check waits for the lock. A stop then waited for
    the check however long it took (and a second SIGTERM was needed); it gets
    the grace, as a claim in flight does."""
    app = leaseq.App(schema=schema)
    app.task("work")(lambda job: None)
    worker = leaseq.Worker(app, dsn=database_url, maintenance=False, shutdown_grace=1)
    async with aqueue.connection() as locker, locker.transaction():
        await locker.execute(f'LOCK TABLE "{schema}".migration IN ACCESS EXCLUSIVE MODE')
        running = asyncio.create_task(worker.run())
        await asyncio.sleep(0.5)  # the check waits for the lock
        assert not running.done()
        worker.request_stop()
        # The lock is held until this block ends: only the grace can end the run.
        await asyncio.wait_for(running, 15)


async def test_a_stop_with_the_database_gone_ends_within_its_bounds(
    aqueue: leaseq.AsyncQueue, database_url: str, schema: str
) -> None:
    """The database stops answering as the worker is stopped (grace 1 s), a sync
    and an async job running. The README's bound: the grace, 10 s for the
    releases, then 5 s to close. Cancelled queries (5 s, then 5 more) and each
    pool's close (5 s, one after another) made it 37 s, past the 30 s a
    container gets between its SIGTERM and its SIGKILL."""
    app = leaseq.App(schema=schema)
    started = threading.Event()

    @app.task("sync_work", lease=60)
    def sync_work(job: leaseq.JobContext) -> None:
        started.set()
        time.sleep(30)  # deaf to job.lost

    @app.task("async_work", lease=60)
    async def async_work(job: leaseq.JobContext) -> None:
        await asyncio.sleep(30)

    await aqueue.enqueue("sync_work", {})
    await aqueue.enqueue("async_work", {})
    with frozen_proxy(database_url) as proxy:
        worker = leaseq.Worker(
            app, dsn=proxy.url, concurrency=2, shutdown_grace=1, maintenance=False, metrics=None
        )
        running = asyncio.create_task(worker.run())
        await asyncio.wait_for(asyncio.to_thread(started.wait, 30), 35)
        while worker.stats.claimed < 2:
            await asyncio.sleep(0.05)
        proxy.frozen.set()
        stopped_at = time.monotonic()
        worker.request_stop()
        await asyncio.wait_for(running, 60)
        took = time.monotonic() - stopped_at
    assert took < 1 + 10 + 1 + 5 + 4  # grace, releases, stragglers, close; slack


async def test_an_embedding_applications_signal_handlers_come_back_after_the_worker(
    schema: str, database_url: str
) -> None:
    """A Worker run with install_signal_handlers replaces the application's own
    SIGTERM and SIGINT handlers while it runs: they were gone once it ended, and
    the application's next SIGTERM killed it instead of its own graceful stop."""
    with leaseq.Queue(database_url, schema=schema) as queue:
        queue.migrate()
    run_script("app_signal_handlers_back.py", schema, database_url)


async def test_one_sigterm_stops_every_worker_of_a_process(schema: str, database_url: str) -> None:
    """Two Workers on one loop, both with install_signal_handlers: the second's
    handler replaced the first's (one SIGTERM stopped one of them), and the first
    to end removed the loop's handler (the next SIGTERM killed the process while
    the other held its jobs)."""
    with leaseq.Queue(database_url, schema=schema) as queue:
        queue.migrate()
    run_script("two_workers_one_signal.py", schema, database_url)
