"""The app's hooks: before a job, around its handler, after its success or failure.

What must hold: each hook sees each job once, where it is said to run, and no
hook, whatever it raises or returns, changes or loses a job's outcome."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any

import pytest

import leaseq
from leaseq import JobStatus
from leaseq.testing import drain, set_clock_offset


def _recording_app(schema: str, events: list[tuple[Any, ...]]) -> leaseq.App:
    app = leaseq.App(schema=schema)

    @app.before_job
    def before(job: leaseq.JobContext) -> None:
        events.append(("before", job.queue, job.payload["n"], threading.current_thread().name))

    @app.before_job
    async def before_async(job: leaseq.JobContext) -> None:
        events.append(("before async", job.queue, job.payload["n"]))

    @app.around_job
    @contextmanager
    def around(job: leaseq.JobContext) -> Iterator[None]:
        events.append(("enter", job.queue, job.payload["n"], threading.current_thread().name))
        try:
            yield
        except Exception as exc:
            events.append(("exit with", job.queue, job.payload["n"], repr(exc)))
            raise
        events.append(("exit", job.queue, job.payload["n"]))

    @app.around_job
    @asynccontextmanager
    async def around_async(job: leaseq.JobContext) -> AsyncIterator[None]:
        events.append(("aenter", job.queue, job.payload["n"]))
        yield
        events.append(("aexit", job.queue, job.payload["n"]))

    @app.on_success
    def success(job: leaseq.JobContext, result: Any) -> None:
        events.append(("success", job.queue, job.payload["n"], result))

    @app.on_failure
    async def failure(job: leaseq.JobContext, error: Any, will_retry: bool) -> None:
        events.append(("failure", job.queue, job.payload["n"], repr(error), will_retry))

    return app


def test_hooks_see_each_job_where_its_handler_runs(
    queue: leaseq.Queue, database_url: str, schema: str
) -> None:
    events: list[tuple[Any, ...]] = []
    app = _recording_app(schema, events)
    handler_threads: dict[str, str] = {}

    @app.task("plain", max_attempts=2, backoff=(600, 600))  # never due within a drain
    def plain(job: leaseq.JobContext) -> int:
        handler_threads["plain"] = threading.current_thread().name
        if job.payload["n"] == 1:
            raise ValueError("no")
        return int(job.payload["n"]) * 10

    @app.task("coro")
    async def coro(job: leaseq.JobContext) -> str:
        handler_threads["coro"] = threading.current_thread().name
        return "ok"

    queue.enqueue("plain", {"n": 0})
    queue.enqueue("plain", {"n": 1})
    queue.enqueue("coro", {"n": 0})
    drain(app, dsn=database_url)

    def of(queue_name: str, n: int) -> list[tuple[Any, ...]]:
        return [e[:1] + e[3:] for e in events if e[1] == queue_name and e[2] == n]

    plain_thread, loop_thread = handler_threads["plain"], handler_threads["coro"]
    assert plain_thread != loop_thread
    # A plain handler: the sync hooks in its thread, the async ones on the loop around it.
    assert of("plain", 0) == [
        ("before async",),
        ("aenter",),
        ("before", plain_thread),
        ("enter", plain_thread),
        ("exit",),
        ("aexit",),
        ("success", 0),
    ]
    assert of("coro", 0) == [
        ("before", loop_thread),
        ("before async",),
        ("enter", loop_thread),
        ("aenter",),
        ("aexit",),
        ("exit",),
        ("success", "ok"),
    ]
    failing = of("plain", 1)
    assert ("exit with", "ValueError('no')") in failing
    assert failing[-1] == ("failure", "ValueError('no')", True)  # a retry is coming

    set_clock_offset(queue, 1000)  # past the backoff
    events.clear()
    drain(app, dsn=database_url)
    assert of("plain", 1)[-1] == ("failure", "ValueError('no')", False)  # failed for good


class OwnBaseException(BaseException):
    """Not an Exception: what some libraries raise to unwind."""


#: What a hook may raise: an error, and what is no Exception (sys.exit() in a hook,
#: a Ctrl-C delivered to its thread). None of them may stop the worker.
HOOK_ERRORS: dict[str, type[BaseException]] = {
    "error": RuntimeError,
    "system_exit": SystemExit,
    "keyboard_interrupt": KeyboardInterrupt,
    "own_base_exception": OwnBaseException,
    # The hook's own (it awaited a task that was cancelled), not the worker's
    # cancellation: it stopped the handler and became the job's outcome.
    "cancelled_error": asyncio.CancelledError,
}


@pytest.mark.parametrize("raised", list(HOOK_ERRORS))
def test_a_failing_hook_never_changes_an_outcome(
    queue: leaseq.Queue, database_url: str, schema: str, raised: str
) -> None:
    app = leaseq.App(schema=schema)
    ran: list[int] = []
    error = HOOK_ERRORS[raised]

    @app.before_job
    def broken_before(job: leaseq.JobContext) -> None:
        raise error("before")

    @app.before_job
    async def broken_async_before(job: leaseq.JobContext) -> None:
        raise error("async before")

    @app.around_job
    def broken_factory(job: leaseq.JobContext) -> Any:
        raise error("factory")

    @app.around_job
    @contextmanager
    def broken_enter(job: leaseq.JobContext) -> Iterator[None]:
        raise error("enter")
        yield  # pragma: no cover

    @app.around_job
    @asynccontextmanager
    async def broken_async_enter(job: leaseq.JobContext) -> AsyncIterator[None]:
        raise error("async enter")
        yield  # pragma: no cover

    class Swallowing:
        """Exits with True (which would swallow the handler's error) and raises."""

        def __init__(self, job: leaseq.JobContext) -> None:
            pass

        def __enter__(self) -> None:
            pass

        def __exit__(self, *details: object) -> bool:
            return True

    class RaisingOnExit(Swallowing):
        def __exit__(self, *details: object) -> bool:
            raise error("exit")

    class RaisingOnAsyncExit:
        def __init__(self, job: leaseq.JobContext) -> None:
            pass

        async def __aenter__(self) -> None:
            pass

        async def __aexit__(self, *details: object) -> bool:
            raise error("async exit")

    app.around_job(Swallowing)
    app.around_job(RaisingOnExit)
    app.around_job(RaisingOnAsyncExit)

    @app.on_success
    def broken_success(job: leaseq.JobContext, result: Any) -> None:
        raise error("success")

    @app.on_success
    async def broken_async_success(job: leaseq.JobContext, result: Any) -> None:
        raise error("async success")

    @app.on_failure
    async def broken_failure(job: leaseq.JobContext, error_: Any, will_retry: bool) -> None:
        raise error("failure")

    @app.on_failure
    def broken_plain_failure(job: leaseq.JobContext, error_: Any, will_retry: bool) -> None:
        raise error("plain failure")

    @app.task("jobs", max_attempts=1)
    def handler(job: leaseq.JobContext) -> int:
        ran.append(job.payload["n"])
        if job.payload["n"] % 2:
            raise ValueError("odd")
        return int(job.payload["n"])

    @app.task("async_jobs", max_attempts=1)
    async def async_handler(job: leaseq.JobContext) -> int:
        return int(handler(job))

    ids = queue.enqueue_many("jobs", [{"n": n} for n in range(6)])
    ids += queue.enqueue_many("async_jobs", [{"n": n} for n in range(6, 12)])
    stats = drain(app, dsn=database_url, concurrency=3, timeout=60)

    assert sorted(ran) == list(range(12))  # each handler ran, once
    assert (stats.completed, stats.failed) == (6, 6)
    for n, job_id in enumerate(ids):
        job = queue.get(job_id)
        if n % 2:
            assert job.status is JobStatus.FAILED
            assert "odd" in (job.last_error or "")
        else:
            assert job.status is JobStatus.DONE
            assert queue.result(job_id) == n


def test_hooks_are_declared_on_the_app_and_returned_unchanged(schema: str) -> None:
    app = leaseq.App(schema=schema)

    def hook(job: leaseq.JobContext) -> None:
        pass

    assert app.before_job(hook) is hook
    assert app.hooks.before == [hook]


def test_a_hung_async_hook_of_a_sync_handler_times_its_attempt_out(
    queue: leaseq.Queue, database_url: str, schema: str
) -> None:
    """What runs before the handler counts against the job's timeout, as it does
    around an async handler: a hook that never returns cannot hold a slot for ever."""
    app = leaseq.App(schema=schema)
    ran: list[int] = []
    exited: list[int] = []

    @app.before_job
    async def hung_before(job: leaseq.JobContext) -> None:
        if job.payload["hang"] == "before":
            await asyncio.sleep(3600)

    @app.around_job
    @asynccontextmanager
    async def hung_enter(job: leaseq.JobContext) -> AsyncIterator[None]:
        if job.payload["hang"] == "enter":
            await asyncio.sleep(3600)
        try:
            yield
        finally:
            exited.append(job.payload["n"])

    @app.task("jobs", max_attempts=1, timeout=1)
    def handler(job: leaseq.JobContext) -> None:
        ran.append(job.payload["n"])

    ids = queue.enqueue_many(
        "jobs", [{"n": 0, "hang": "before"}, {"n": 1, "hang": "enter"}, {"n": 2, "hang": ""}]
    )
    stats = drain(app, dsn=database_url, concurrency=3, timeout=30)

    assert ran == [2]  # the hung jobs' handlers never started
    assert (stats.completed, stats.failed, stats.timeouts) == (1, 2, 2)
    for job_id in ids[:2]:
        job = queue.get(job_id)
        assert job.status is JobStatus.FAILED
        assert "timed out after 1s" in (job.last_error or "")
    assert exited == [2]  # only an entered context is exited


@pytest.mark.server_agnostic  # a hook's bound, in the worker
def test_a_hung_async_exit_cannot_hold_a_slot_for_ever(
    queue: leaseq.Queue, database_url: str, schema: str
) -> None:
    """An async around_job hook's exit is bounded too: under the job's timeout when
    the handler returned or raised in time, and by a short grace once the job
    timed out (its deadline is gone). Never may a hung exit keep a job running."""
    app = leaseq.App(schema=schema)
    ran: list[int] = []
    exited: list[int] = []

    class Outer:
        # (a class: a generator's finally would also run when it is collected)
        def __init__(self, job: leaseq.JobContext) -> None:
            self.n = job.payload["n"]

        async def __aenter__(self) -> None:
            pass

        async def __aexit__(self, *details: object) -> None:
            await asyncio.sleep(0)
            exited.append(self.n)  # after the inner one, hung or not

    app.around_job(Outer)

    @app.around_job
    @asynccontextmanager
    async def hung_exit(job: leaseq.JobContext) -> AsyncIterator[None]:
        try:
            yield
        finally:
            if job.payload["hang_exit"]:
                await asyncio.sleep(3600)

    @app.task("plain", max_attempts=1, timeout=1)
    def plain(job: leaseq.JobContext) -> None:
        ran.append(job.payload["n"])
        if job.payload["slow"]:
            threading.Event().wait(1.5)  # past the timeout
        if job.payload["raise"]:
            raise ValueError("the handler's own error")

    @app.task("coroutines", max_attempts=1, timeout=1)
    async def coroutine(job: leaseq.JobContext) -> None:
        ran.append(job.payload["n"])
        if job.payload["slow"]:
            await asyncio.sleep(3600)

    def job(n: int, *, hang_exit: bool, slow: bool = False, fail: bool = False) -> dict[str, Any]:
        return {"n": n, "hang_exit": hang_exit, "slow": slow, "raise": fail}

    plain_ids = queue.enqueue_many(
        "plain",
        [
            job(0, hang_exit=True),  # returned in time, hung on the way out
            job(1, hang_exit=True, fail=True),  # raised in time, hung on the way out
            job(2, hang_exit=True, slow=True),  # timed out, then hung on the way out
            job(3, hang_exit=False),
        ],
    )
    async_ids = queue.enqueue_many(
        "coroutines", [job(10, hang_exit=True, slow=True), job(11, hang_exit=False)]
    )
    stats = drain(app, dsn=database_url, concurrency=6, timeout=40)

    assert sorted(ran) == [0, 1, 2, 3, 10, 11]
    assert sorted(exited) == [0, 1, 2, 3, 10, 11]  # a hung exit cost no other its exit
    statuses = {job_id: queue.get(job_id) for job_id in plain_ids + async_ids}
    assert [statuses[i].status for i in plain_ids] == [JobStatus.FAILED] * 3 + [JobStatus.DONE]
    assert [statuses[i].status for i in async_ids] == [JobStatus.FAILED, JobStatus.DONE]
    for job_id in (*plain_ids[:3], async_ids[0]):
        assert "timed out after 1s" in (statuses[job_id].last_error or ""), job_id
    assert (stats.completed, stats.failed) == (2, 4)


def test_a_hung_after_hook_frees_its_slot_after_the_jobs_timeout(
    queue: leaseq.Queue, database_url: str, schema: str
) -> None:
    """on_success and on_failure run after the outcome was recorded; one that hangs
    is waited for as long as its job may run, never for ever (the slot is freed),
    and what it hangs on changes no outcome."""
    app = leaseq.App(schema=schema)
    release = threading.Event()

    @app.on_success
    async def hung_success(job: leaseq.JobContext, result: Any) -> None:
        if job.payload["hang"]:
            await asyncio.sleep(3600)

    @app.on_failure
    def hung_failure(job: leaseq.JobContext, error: Any, will_retry: bool) -> None:
        if job.payload["hang"]:
            release.wait(60)  # a plain hook, in a thread of its own

    @app.task("jobs", max_attempts=1, timeout=1)
    async def handler(job: leaseq.JobContext) -> str:
        if job.payload["fail"]:
            raise ValueError("no")
        return "ok"

    try:
        ids = queue.enqueue_many(
            "jobs",
            [
                {"hang": True, "fail": False},
                {"hang": True, "fail": True},
                {"hang": False, "fail": False},
            ],
        )
        stats = drain(app, dsn=database_url, concurrency=3, timeout=30)
    finally:
        release.set()

    assert [queue.get(i).status for i in ids] == [JobStatus.DONE, JobStatus.FAILED, JobStatus.DONE]
    assert (stats.completed, stats.failed) == (2, 1)


@pytest.mark.parametrize("kind", ["async", "plain"])
def test_a_jobs_slot_stays_taken_until_its_after_hooks_return(
    queue: leaseq.Queue, database_url: str, schema: str, kind: str
) -> None:
    """The README: "the job's slot is free again once its hooks have returned".
    The slot was freed when the handler returned, so with slow hooks the worker
    had ten jobs between their start and their hook's end at concurrency 2."""
    app = leaseq.App(schema=schema)
    lock = threading.Lock()
    busy = 0
    most = 0

    def hook_done() -> None:
        nonlocal busy
        with lock:
            busy -= 1

    if kind == "async":

        @app.on_success
        async def slow_async(job: leaseq.JobContext, result: Any) -> None:
            await asyncio.sleep(0.3)
            hook_done()

    else:

        @app.on_success
        def slow_plain(job: leaseq.JobContext, result: Any) -> None:
            threading.Event().wait(0.3)
            hook_done()

    @app.task("jobs")
    async def handler(job: leaseq.JobContext) -> None:
        nonlocal busy, most
        with lock:
            busy += 1
            most = max(most, busy)

    ids = queue.enqueue_many("jobs", [{"n": n} for n in range(8)])
    stats = drain(app, dsn=database_url, concurrency=2, timeout=60)
    assert stats.completed == 8
    assert all(queue.get(i).status is JobStatus.DONE for i in ids)
    assert busy == 0
    assert most <= 2, most


def test_a_hung_plain_hook_does_not_hold_up_the_hooks_of_later_jobs(
    queue: leaseq.Queue, database_url: str, schema: str
) -> None:
    """Plain hooks run in a pool of one thread per slot. A hook no longer waited for
    (past its job's timeout) kept its thread, so the hooks of the jobs after it
    queued behind it: logged as not returning in time without having started,
    and run long after the drain had returned."""
    app = leaseq.App(schema=schema)
    release = threading.Event()
    started: list[int] = []

    @app.on_success
    def report(job: leaseq.JobContext, result: Any) -> None:
        started.append(job.payload["n"])
        if job.payload["n"] < 2:
            release.wait(60)

    @app.task("jobs", timeout=1)
    def handler(job: leaseq.JobContext) -> None:
        pass

    try:
        queue.enqueue_many("jobs", [{"n": n} for n in range(8)])
        stats = drain(app, dsn=database_url, concurrency=2, timeout=30)
        assert stats.completed == 8
        assert sorted(started) == list(range(8))  # every hook ran, within the drain
    finally:
        release.set()


async def test_a_sync_handler_whose_lease_is_lost_during_an_async_before_hook_never_runs(
    queue: leaseq.Queue, database_url: str, schema: str
) -> None:
    """The hook runs on the loop before the handler's thread starts: a lease lost
    meanwhile (here: an operator's cancel) still let the handler run once the
    hook returned, after its attempt had ended."""
    app = leaseq.App(schema=schema)
    hooked, ran = asyncio.Event(), []

    @app.before_job
    async def slow(job: leaseq.JobContext) -> None:
        hooked.set()
        await asyncio.sleep(2)

    @app.task("jobs")
    def handler(job: leaseq.JobContext) -> None:
        ran.append(job.job_id)

    job_id = queue.enqueue("jobs", {})
    worker = leaseq.Worker(app, dsn=database_url, poll_interval=0.1, maintenance=False)
    running = asyncio.create_task(worker.run())
    try:
        await asyncio.wait_for(hooked.wait(), 30)
        assert await asyncio.to_thread(queue.cancel, job_id, running=True)
        deadline = asyncio.get_running_loop().time() + 30
        while worker.stats.lost_leases == 0:  # told through the cancel's notification
            assert asyncio.get_running_loop().time() < deadline
            await asyncio.sleep(0.05)
        await asyncio.sleep(2.5)  # the hook has returned
    finally:
        worker.request_stop()
        await asyncio.wait_for(running, 30)
    assert ran == []
    assert queue.get(job_id).status is JobStatus.CANCELLED


async def test_a_stop_does_not_wait_for_the_after_hooks_of_a_recorded_outcome(
    queue: leaseq.Queue, database_url: str, schema: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A hung on_success hook of a job already done: the stop waited ten seconds
    more past its grace, and said the job was "not acknowledged ... will run
    again", though the database had its outcome."""
    app = leaseq.App(schema=schema)
    hooked = asyncio.Event()

    @app.on_success
    async def report(job: leaseq.JobContext, result: Any) -> None:
        hooked.set()
        await asyncio.sleep(60)

    @app.task("jobs")
    async def handler(job: leaseq.JobContext) -> str:
        return "ok"

    job_id = queue.enqueue("jobs", {})
    worker = leaseq.Worker(
        app, dsn=database_url, poll_interval=0.1, maintenance=False, shutdown_grace=0.5
    )
    running = asyncio.create_task(worker.run())
    await asyncio.wait_for(hooked.wait(), 30)
    worker.request_stop()
    await asyncio.wait_for(running, 8)  # the grace, and a moment: not ten seconds more
    assert queue.get(job_id).status is JobStatus.DONE
    assert not [r for r in caplog.records if "not acknowledged" in r.getMessage()]
    assert [r for r in caplog.records if "after hooks were still running" in r.getMessage()]


def test_on_success_sees_the_result_the_jobs_completion_stored(
    queue: leaseq.Queue, schema: str
) -> None:
    """A handler whose job.transaction() completed its job and that then changes
    ``job.result`` (a second job.transaction(), refused with AlreadyCompleted and
    rolled back; or a plain assignment after the block) stored the first value:
    on_success must be told that one, never a result the job does not have."""
    seen: dict[str, Any] = {}
    app = leaseq.App(schema=schema)

    @app.on_success
    def success(job: leaseq.JobContext, result: Any) -> None:
        seen[job.queue] = result

    @app.task("twice")
    def twice(job: leaseq.JobContext) -> None:
        with job.transaction():
            job.result = "committed"
        with job.transaction():  # raises AlreadyCompleted: rolled back
            job.result = "rolled back"

    @app.task("after")
    async def after(job: leaseq.JobContext) -> None:
        async with job.atransaction():
            job.result = "committed"
        job.result = "set after the commit"

    ids = {name: queue.enqueue(name, {}) for name in ("twice", "after")}
    drain(app)
    for name, job_id in ids.items():
        assert queue.result(job_id) == "committed"
        assert seen[name] == "committed"
