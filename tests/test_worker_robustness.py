"""The worker under adversity: poisoned outcomes, handlers' own timeouts, locked rows,
partitions, starved pools, sync threads that outlive their attempt, group signals."""

from __future__ import annotations

import asyncio
import contextlib
import os
import pickle
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

import leaseq
from leaseq import JobStatus
from leaseq._worker.outcomes import Answer, Kind, Outcome, Outcomes

from .test_worker import Running, _all_finished, _until
from .test_worker_processes import _attempts_logged, _wait, setup_tables  # noqa: F401
from .worker_processes import Spawn, output_of, worker_processes


def _app(schema: str) -> leaseq.App:
    return leaseq.App(schema=schema)


# -- 3. one bad outcome must not sink the whole flush ------------------------------------


async def test_an_invalid_retry_delay_fails_its_own_job_and_sinks_nothing_else(
    aqueue: leaseq.AsyncQueue, database_url: str, schema: str
) -> None:
    app = _app(schema)
    together = asyncio.Barrier(3)  # all three first attempts finish in one flush

    class Unprintable(Exception):
        def __str__(self) -> str:
            raise RuntimeError("no text for you")

    @app.task("work", max_attempts=2, backoff=(0, 0))
    async def handler(job: leaseq.JobContext) -> None:
        if job.attempts == 1:
            await together.wait()
        kind = job.payload["kind"]
        if kind == "bad-delay":
            job.retry(delay=-1)
        if kind == "unprintable":
            raise Unprintable()
        raise RuntimeError("upstream broke")

    ids = {
        k: await aqueue.enqueue("work", {"kind": k}) for k in ("bad-delay", "unprintable", "error")
    }
    running = Running(leaseq.Worker(app, dsn=database_url, concurrency=3, poll_interval=0.1))
    await _until(lambda: _all_finished(aqueue, "work"), timeout=15)
    await running.stop()
    bad = await aqueue.get(ids["bad-delay"])
    assert (bad.status, bad.attempts) == (JobStatus.FAILED, 1)  # InvalidArgument is permanent
    assert (bad.last_error or "").startswith("InvalidArgument: delay must be >= 0")
    unprintable = await aqueue.get(ids["unprintable"])
    assert (unprintable.status, unprintable.attempts) == (JobStatus.FAILED, 2)
    assert unprintable.history[0]["outcome"] == "retry"
    assert (unprintable.last_error or "").startswith("Unprintable")
    error = await aqueue.get(ids["error"])
    assert (error.status, error.attempts) == (JobStatus.FAILED, 2)
    assert error.history[0]["outcome"] == "retry"
    assert error.history[0]["error"] == error.last_error == "RuntimeError: upstream broke"


def test_retry_requests_are_checked_where_they_are_made() -> None:
    with pytest.raises(leaseq.InvalidArgument, match="delay"):
        leaseq.Retry(delay=-1)
    with pytest.raises(leaseq.InvalidArgument, match="delay"):
        leaseq.Retry(delay=float("nan"))
    assert leaseq.Retry(delay=2.5).delay == 2.5
    assert leaseq.Retry().delay is None
    copy = pickle.loads(pickle.dumps(leaseq.Retry(3, "later")))  # e.g. from another process
    assert (copy.delay, copy.reason) == (3, "later")
    with pytest.raises(leaseq.InvalidArgument, match="backoff cap"):
        leaseq.Backoff(0, 1e12)  # its delays would be refused by every retry
    # The reason is the job's last error: None or an object recorded an empty
    # error, or a repr of whatever it was, instead of saying why.
    for reason in (None, 42, object(), b"later"):
        with pytest.raises(leaseq.InvalidArgument, match="reason"):
            leaseq.Retry(1, reason)  # type: ignore[arg-type]


async def test_a_poisoned_outcome_is_reported_on_its_own_job_and_the_batch_lands(
    aqueue: leaseq.AsyncQueue,
) -> None:
    ids = await aqueue.enqueue_many("work", [{"n": n} for n in range(3)])
    first, poisoned, last = await aqueue.claim("work", limit=3)
    outcomes = Outcomes(aqueue)
    flusher = asyncio.create_task(outcomes.run())
    try:
        results = await asyncio.wait_for(
            asyncio.gather(
                outcomes.report(Outcome(Kind.RETRY, first, delay=0, error="first")),
                # (delay=-1 bypasses the check of Retry)
                outcomes.report(Outcome(Kind.RETRY, poisoned, delay=-1, error="second")),
                outcomes.report(Outcome(Kind.RETRY, last, delay=0, error="third")),
                return_exceptions=True,
            ),
            20,
        )
    finally:
        flusher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await flusher
    assert results[0] is Answer.RETRIED
    assert results[2] is Answer.RETRIED
    assert isinstance(results[1], leaseq.InvalidArgument)
    jobs = [await aqueue.get(i) for i in ids]
    assert [j.status for j in jobs] == [JobStatus.QUEUED, JobStatus.RUNNING, JobStatus.QUEUED]
    assert [jobs[0].last_error, jobs[2].last_error] == ["first", "third"]


# -- 4. a handler's own TimeoutError is an ordinary error ---------------------------------


@pytest.mark.parametrize("kind", ["async", "sync"])
@pytest.mark.parametrize("timeout", [None, 30.0])
async def test_a_handlers_own_timeout_error_is_an_ordinary_error(
    aqueue: leaseq.AsyncQueue, database_url: str, schema: str, kind: str, timeout: float | None
) -> None:
    app = _app(schema)
    options: dict[str, Any] = {"timeout": timeout, "max_attempts": 2, "backoff": (0, 0)}
    if timeout is not None:
        options["fail_on"] = (TimeoutError,)  # the handler's own timeout obeys the policy
    if kind == "async":

        @app.task("work", **options)
        async def async_handler(job: leaseq.JobContext) -> None:
            raise TimeoutError("read timed out")  # what socket.timeout is

    else:

        @app.task("work", **options)
        def sync_handler(job: leaseq.JobContext) -> None:
            raise TimeoutError("read timed out")  # what socket.timeout is

    job_id = await aqueue.enqueue("work", {})
    running = Running(leaseq.Worker(app, dsn=database_url, poll_interval=0.1))
    await _until(lambda: _all_finished(aqueue, "work"), timeout=15)
    await running.stop()
    job = await aqueue.get(job_id)
    assert job.status is JobStatus.FAILED
    assert job.last_error == "TimeoutError: read timed out"
    assert job.attempts == (2 if timeout is None else 1)
    assert running.worker.stats.timeouts == 0


# -- 5. renewals must not fall silently behind --------------------------------------------


async def test_one_locked_row_costs_no_other_job_its_lease(
    aqueue: leaseq.AsyncQueue, database_url: str, schema: str
) -> None:
    app = _app(schema)
    started: set[int] = set()
    cancelled: list[int] = []

    @app.task("long", lease=2)
    async def handler(job: leaseq.JobContext) -> None:
        started.add(job.job_id)
        if job.attempts > 1:
            return
        try:
            await asyncio.sleep(6)
        except asyncio.CancelledError:
            cancelled.append(job.job_id)
            raise

    locked, *others = await aqueue.enqueue_many("long", [{}, {}, {}])
    worker = leaseq.Worker(
        app, dsn=database_url, concurrency=3, poll_interval=0.1, maintenance=False
    )
    running = Running(worker)
    await _until(lambda: _true(len(started) == 3))
    async with aqueue.connection() as blocker, blocker.transaction():
        await blocker.execute(
            f'SELECT 1 FROM "{schema}".job WHERE job_id = %s FOR UPDATE', (locked,)
        )
        await asyncio.sleep(5)  # two and a half leases
    await _until(lambda: _all_finished(aqueue, "long"))
    await running.stop()
    for job_id in others:
        job = await aqueue.get(job_id)
        assert (job.status, job.attempts) == (JobStatus.DONE, 1)
    # The locked job's renewal was refused: its attempt was stopped before its lease ran
    # out, and recovered once the lock was gone.
    job = await aqueue.get(locked)
    assert (job.status, job.attempts) == (JobStatus.DONE, 2)
    assert job.history[0]["outcome"] == "lease_expired"
    assert cancelled == [locked]
    assert worker.stats.lost_leases == 1


async def _true(value: bool) -> bool:
    return value


class PausableProxy:
    """A TCP proxy to PostgreSQL that can stop forwarding: a partition where bytes just
    stop arriving (nothing is refused or reset), until heal()."""

    def __init__(self, url: str) -> None:
        params = conninfo_to_dict(url)
        self.url = url
        self.host = str(params.get("host") or "127.0.0.1")
        self.port = int(params.get("port") or 5432)
        self._flowing = asyncio.Event()
        self._flowing.set()
        self._writers: list[asyncio.StreamWriter] = []
        self._server: asyncio.Server | None = None

    async def start(self) -> str:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        return make_conninfo(self.url, host="127.0.0.1", port=str(port))

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.append(writer)
        try:
            if self.host.startswith("/"):  # a Unix socket folder (the embedded server)
                socket_path = f"{self.host}/.s.PGSQL.{self.port}"
                up_reader, up_writer = await asyncio.open_unix_connection(socket_path)
            else:
                up_reader, up_writer = await asyncio.open_connection(self.host, self.port)
        except OSError:
            writer.close()
            return
        self._writers.append(up_writer)
        await asyncio.gather(
            self._pump(reader, up_writer), self._pump(up_reader, writer), return_exceptions=True
        )

    async def _pump(self, source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
        try:
            while data := await source.read(65536):
                await self._flowing.wait()
                sink.write(data)
                await sink.drain()
        finally:
            sink.close()

    def partition(self) -> None:
        self._flowing.clear()

    def heal(self) -> None:
        self._flowing.set()

    async def close(self) -> None:
        self.heal()
        for writer in self._writers:
            writer.close()
        if self._server is not None:
            self._server.close()


async def test_a_partitioned_worker_stops_its_handlers_before_another_can_reclaim(
    aqueue: leaseq.AsyncQueue, database_url: str, schema: str
) -> None:
    """The renewal hangs (a partition): the worker's own deadline must tell the handlers."""
    told: set[int] = set()
    started = {"async": threading.Event(), "sync": threading.Event()}
    test_over = threading.Event()
    partitioned, healthy = _app(schema), _app(schema)

    @partitioned.task("async-work", lease=2)
    async def async_handler(job: leaseq.JobContext) -> None:
        started["async"].set()
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            told.add(job.job_id)
            raise

    @partitioned.task("sync-work", lease=2)
    def sync_handler(job: leaseq.JobContext) -> None:
        started["sync"].set()
        while not (job.lost.wait(0.02) or test_over.is_set()):
            pass
        if job.lost.is_set():
            told.add(job.job_id)

    told_before_reclaim: dict[int, bool] = {}

    @healthy.task("async-work", lease=2)
    async def async_recovery(job: leaseq.JobContext) -> None:
        told_before_reclaim[job.job_id] = job.job_id in told

    @healthy.task("sync-work", lease=2)
    def sync_recovery(job: leaseq.JobContext) -> None:
        told_before_reclaim[job.job_id] = job.job_id in told

    ids = [await aqueue.enqueue("async-work", {}), await aqueue.enqueue("sync-work", {})]
    proxy = PausableProxy(database_url)
    proxied = await proxy.start()
    first = Running(
        leaseq.Worker(partitioned, dsn=proxied, listen=False, poll_interval=0.1, maintenance=False)
    )
    second: Running | None = None
    try:
        await _until(lambda: _true(all(e.is_set() for e in started.values())))
        proxy.partition()
        second = Running(
            leaseq.Worker(healthy, dsn=database_url, poll_interval=0.1, maintenance=False)
        )
        await _until(lambda: _true(len(told_before_reclaim) == 2))
    finally:
        test_over.set()
        proxy.heal()
        if second is not None:
            await second.stop()
        await first.stop()
        await proxy.close()
    assert told_before_reclaim == dict.fromkeys(ids, True)
    for job_id in ids:
        assert (await aqueue.get(job_id)).status is JobStatus.DONE


async def test_a_sync_handler_is_told_at_its_deadline_while_an_async_one_blocks_the_loop(
    aqueue: leaseq.AsyncQueue, database_url: str, schema: str
) -> None:
    """An ``async def`` handler blocks the event loop (a ``time.sleep``, a blocking
    client) for longer than a sync handler's lease: nothing renews that lease, and
    the database lets another worker reclaim the job at its end. The sync handler,
    running on in its thread, must be told (job.lost) before then, not once the
    loop runs again: else it works on beside the job's next attempt, unknowing."""
    app = _app(schema)
    started, blocking = threading.Event(), threading.Event()
    told: list[tuple[bool, bool]] = []  # (while the loop was blocked, lease live in the database)

    @app.task("sync-work", lease=3, max_attempts=1)
    def sync_handler(job: leaseq.JobContext) -> None:
        started.set()
        if not job.lost.wait(30):
            return
        while_blocked = blocking.is_set()
        with job.connection() as conn:
            row = conn.execute(
                f'SELECT lease_until > "{schema}".clock() FROM "{schema}".job WHERE job_id = %s',
                (job.job_id,),
            ).fetchone()
        told.append((while_blocked, bool(row and row[0])))

    @app.task("blocking", max_attempts=1)
    async def blocking_handler(job: leaseq.JobContext) -> None:
        while not started.is_set():
            await asyncio.sleep(0.01)
        blocking.set()
        time.sleep(9)  # the bug under test: a blocking call on the event loop
        blocking.clear()

    await aqueue.enqueue("sync-work", {})
    await aqueue.enqueue("blocking", {})
    running = Running(leaseq.Worker(app, dsn=database_url, poll_interval=0.1, maintenance=False))
    try:
        await _until(lambda: _all_finished(aqueue, "blocking"), timeout=40)
        await _until(lambda: _all_finished(aqueue, "sync-work"), timeout=40)
    finally:
        await running.stop()
    assert told == [(True, True)]
    assert running.worker.stats.lost_leases == 1


async def test_busy_handler_transactions_do_not_starve_renewals(
    aqueue: leaseq.AsyncQueue, database_url: str, schema: str
) -> None:
    """Every connection of the handlers' pool is inside a long handler transaction."""
    app = _app(schema)

    @app.task("tx", lease=2)
    async def handler(job: leaseq.JobContext) -> None:
        async with job.atransaction() as conn:
            await conn.execute("SELECT 1")
            if job.attempts == 1:
                await asyncio.sleep(4)  # two leases

    ids = await aqueue.enqueue_many("tx", [{} for _ in range(4)])
    worker = leaseq.Worker(
        app, dsn=database_url, concurrency=4, poll_interval=0.1, maintenance=False
    )
    running = Running(worker)
    await _until(lambda: _all_finished(aqueue, "tx"))
    await running.stop()
    for job_id in ids:
        job = await aqueue.get(job_id)
        assert (job.status, job.attempts) == (JobStatus.DONE, 1)
    assert worker.stats.lost_leases == 0


async def test_renew_many_skips_a_locked_row_and_reports_it_busy(
    aqueue: leaseq.AsyncQueue, schema: str
) -> None:
    await aqueue.enqueue_many("work", [{}, {}, {}])
    locked, free, done = await aqueue.claim("work", limit=3, lease=30)
    await aqueue.complete(done)
    async with aqueue.connection() as blocker, blocker.transaction():
        await blocker.execute(
            f'SELECT 1 FROM "{schema}".job WHERE job_id = %s FOR UPDATE', (locked.job_id,)
        )
        # Waiting for our lock here would be the defect: wait_for raises after 10 s.
        results = await asyncio.wait_for(aqueue.renew_many([locked, free, done], lease=60), 10)
    (_, busy), (_, renewed), (_, lost) = results
    assert busy is leaseq.RENEWAL_BUSY
    assert renewed is not None
    assert renewed is not leaseq.RENEWAL_BUSY
    assert lost is None
    assert (await aqueue.get(free.job_id)).lease_until == renewed
    # The single-claim form waits for the lock like the other single fenced writes.
    assert await aqueue.renew(locked, lease=60) > locked.lease_until


# -- 6. sync handlers that outlive their attempt ------------------------------------------


async def test_a_timed_out_sync_handler_keeps_its_lease_until_its_thread_returns(
    aqueue: leaseq.AsyncQueue, database_url: str, schema: str
) -> None:
    app = _app(schema)
    events: list[tuple[str, int]] = []
    seen: dict[str, bool] = {}

    @app.task("slow", timeout=0.5, lease=2, max_attempts=2, backoff=(0, 0))
    def handler(job: leaseq.JobContext) -> None:
        events.append(("start", job.attempts))
        if job.attempts == 1:
            time.sleep(3)  # ignores job.lost; longer than the lease
            seen["told"] = job.lost.is_set()
            try:
                with job.transaction():
                    pass
            except leaseq.LeaseLost:
                seen["completion_refused"] = True
        events.append(("end", job.attempts))

    job_id = await aqueue.enqueue("slow", {})
    worker = leaseq.Worker(
        app, dsn=database_url, concurrency=2, poll_interval=0.1, maintenance=False
    )
    running = Running(worker)
    await _until(lambda: _all_finished(aqueue, "slow"))
    await running.stop()
    assert events == [("start", 1), ("end", 1), ("start", 2), ("end", 2)]
    assert seen == {"told": True, "completion_refused": True}
    job = await aqueue.get(job_id)
    assert (job.status, job.attempts) == (JobStatus.DONE, 2)
    # Reported when the thread returned, by the attempt that still held the lease.
    assert (job.history[0]["outcome"], job.history[0]["error"]) == ("retry", "timed out after 0.5s")
    assert worker.stats.timeouts == 1
    assert worker.stats.lost_leases == 0


@pytest.fixture
def spawn_in_session(database_url: str, schema: str) -> Iterator[Spawn]:
    """`leaseq worker` in a session (process group) of its own, killed with its group."""
    with worker_processes(database_url, schema, own_session=True) as spawn:
        yield spawn


def test_a_sync_handler_that_ignores_lost_does_not_keep_the_process_alive(
    setup_tables: leaseq.Queue,  # noqa: F811
    spawn_in_session: Spawn,
) -> None:
    queue = setup_tables
    job_id = queue.enqueue("work", {"sleep": 120, "stubborn": True})
    worker = spawn_in_session("--shutdown-grace", "1")
    _wait(lambda: _attempts_logged(queue, job_id) == 1, what="job started")
    worker.send_signal(signal.SIGTERM)
    try:
        assert worker.wait(30) == 0
    except subprocess.TimeoutExpired:
        pytest.fail("the worker did not exit after its grace period")
    job = queue.get(job_id)
    assert (job.status, job.attempts) == (JobStatus.QUEUED, 0)
    assert job.history[-1]["outcome"] == "released"


# -- 7. --processes N and a process-group signal -------------------------------------------


def test_a_group_wide_sigterm_finishes_or_releases_every_job(
    setup_tables: leaseq.Queue,  # noqa: F811
    spawn_in_session: Spawn,
) -> None:
    queue = setup_tables
    short = queue.enqueue_many("work", [{"sleep": 1.0} for _ in range(2)])
    long = queue.enqueue_many("work", [{"sleep": 120} for _ in range(2)])
    supervisor = spawn_in_session("--processes", "2", "--concurrency", "2", "--shutdown-grace", "4")
    _wait(
        lambda: all(_attempts_logged(queue, i) == 1 for i in short + long),
        what="all four jobs started",
    )
    os.killpg(supervisor.pid, signal.SIGTERM)  # what Ctrl-C or systemd does: everyone
    assert supervisor.wait(60) == 0
    for job_id in short:
        assert queue.get(job_id).status is JobStatus.DONE
    for job_id in long:
        job = queue.get(job_id)
        assert (job.status, job.attempts) == (JobStatus.QUEUED, 0)
        assert job.history[-1]["outcome"] == "released"
    output = output_of(supervisor)
    assert "second signal" not in output, output


@pytest.mark.server_agnostic  # signals and exit
def test_a_deliberate_second_group_signal_still_exits_at_once(
    setup_tables: leaseq.Queue,  # noqa: F811
    spawn_in_session: Spawn,
) -> None:
    queue = setup_tables
    ids = queue.enqueue_many("work", [{"sleep": 120} for _ in range(2)])
    supervisor = spawn_in_session(
        "--processes", "2", "--concurrency", "1", "--shutdown-grace", "60"
    )
    _wait(lambda: all(_attempts_logged(queue, i) == 1 for i in ids), what="both jobs started")
    os.killpg(supervisor.pid, signal.SIGTERM)
    time.sleep(2.0)  # later than any echo of the first signal
    assert supervisor.poll() is None  # still within its grace period
    os.killpg(supervisor.pid, signal.SIGINT)
    supervisor.wait(20)
    # Not released: the leases will expire and another worker will recover the jobs.
    for job_id in ids:
        assert queue.get(job_id).status is JobStatus.RUNNING


async def _swallow_one_cancellation(started: asyncio.Event) -> None:
    """What Python 3.11's ``asyncio.wait_for`` does when its result and a
    cancellation arrive together (psycopg_pool waits for a new pool's first
    connection with it): the cancellation is consumed, the caller goes on.
    Only the first call swallows (a loop that fails the test still ends)."""
    if started.is_set():
        return
    started.set()
    with contextlib.suppress(asyncio.CancelledError):
        await asyncio.sleep(30)


@pytest.mark.asyncio
@pytest.mark.parametrize("service", ["schedules", "listen"])
async def test_a_service_ends_on_its_cancellation_even_when_a_call_swallowed_it(
    service: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker stopped right after it started waited forever for its scheduler:
    the scheduler's first pass lost the cancellation in the pool's opening, and
    the loop slept on (5 stops in 50 hung, tests run at startup with SIGTERM). A
    service loop raises a pending cancellation at its next pause."""
    from leaseq._worker.listener import listen_for_work
    from leaseq._worker.scheduler import Scheduler
    from leaseq._worker.state import WorkerStats

    started = asyncio.Event()
    if service == "schedules":

        async def swallowing_pass(self: Scheduler) -> int:
            await _swallow_one_cancellation(started)
            return 0

        monkeypatch.setattr(Scheduler, "run_once", swallowing_pass)
        loop = Scheduler(None, {}).run()  # type: ignore[arg-type]
    else:

        class Listener:
            async def _listen(self) -> Any:
                await _swallow_one_cancellation(started)
                raise leaseq.TransientError("connection lost")
                yield ""  # an async generator, as the client's

        loop = listen_for_work(
            Listener(),  # type: ignore[arg-type]
            {"q"},
            work=lambda _: None,
            lost=lambda _: None,
            stats=WorkerStats(),
        )
    task = asyncio.create_task(loop)
    await started.wait()
    task.cancel()
    done, _ = await asyncio.wait({task}, timeout=5)
    if not done:
        task.cancel()  # a second cancellation ends it: fail, do not hang
        await asyncio.wait({task}, timeout=5)
    assert done, f"the {service} loop did not end on its cancellation"
    assert task.cancelled()


# -- a claim in flight when the worker is told to stop ------------------------------------


async def _worker_blocked_in_its_claim(
    queue: leaseq.Queue, database_url: str, grace: float
) -> tuple[leaseq.Worker, asyncio.Task[None], psycopg.Connection[Any], int, list[int]]:
    """An idle worker whose next poll's claim waits on a lock of the job table (a
    migration's, a VACUUM FULL's); the lock's holder enqueued a job meanwhile."""
    app = _app(queue.schema)
    ran: list[int] = []

    @app.task("work")
    async def handler(job: leaseq.JobContext) -> None:
        ran.append(job.job_id)

    worker = leaseq.Worker(
        app, dsn=database_url, poll_interval=0.1, listen=False, shutdown_grace=grace
    )
    running = asyncio.create_task(worker.run())
    await asyncio.sleep(0.5)  # idle, polling
    locker = psycopg.connect(database_url)
    locker.execute(f'LOCK TABLE "{queue.schema}".job IN ACCESS EXCLUSIVE MODE')
    job_id = queue.enqueue("work", {}, conn=locker)
    deadline = time.monotonic() + 10
    while True:  # its claim waits on the lock now
        row = locker.execute(
            "SELECT count(*) FROM pg_locks WHERE NOT granted AND relation = %s::regclass",
            (f'"{queue.schema}".job',),
        ).fetchone()
        if row and row[0] > 0:
            break
        assert time.monotonic() < deadline, "the worker's claim never waited on the lock"
        await asyncio.sleep(0.05)
    return worker, running, locker, job_id, ran


async def test_a_claim_that_returns_after_the_stop_starts_nothing_and_is_given_back(
    queue: leaseq.Queue, database_url: str
) -> None:
    """It started the jobs after the stop (whose grace then waited for them), and a
    job recovered by it had its attempt used up by a lease run out meanwhile."""
    worker, running, locker, job_id, ran = await _worker_blocked_in_its_claim(
        queue, database_url, grace=10
    )
    worker.request_stop()
    await asyncio.sleep(0.2)
    locker.commit()  # the claim goes on, after the stop, and finds the job
    locker.close()
    await asyncio.wait_for(running, 30)
    assert ran == []
    job = queue.get(job_id)
    assert (job.status, job.attempts) == (JobStatus.QUEUED, 0), job.history
    assert job.lease_version == 1  # it was claimed, then given back


async def test_a_claim_stuck_past_the_grace_of_a_stop_is_cancelled(
    queue: leaseq.Queue, database_url: str
) -> None:
    """The stop waited for as long as the lock was held (45 s in the report)."""
    worker, running, locker, _, ran = await _worker_blocked_in_its_claim(
        queue, database_url, grace=1
    )
    stopped_at = time.monotonic()
    worker.request_stop()
    try:
        await asyncio.wait_for(running, 30)  # the grace, then psycopg's cancel
        waited = time.monotonic() - stopped_at
    finally:
        locker.rollback()
        locker.close()
    assert waited < 15, waited
    assert ran == []


@contextlib.contextmanager
def _role_without(database_url: str, schema: str, table: str) -> Iterator[str]:
    """A login role with every privilege on ``schema`` but those on ``table`` (a
    revoked grant); the URL that logs in as it."""
    role = f"t_role_{os.urandom(6).hex()}"
    with psycopg.connect(database_url, autocommit=True) as admin:
        admin.execute(f"CREATE ROLE {role} LOGIN")
        admin.execute(f'GRANT USAGE ON SCHEMA "{schema}" TO {role}')
        for kind in ("TABLES", "SEQUENCES", "FUNCTIONS"):
            admin.execute(f'GRANT ALL ON ALL {kind} IN SCHEMA "{schema}" TO {role}')
        admin.execute(f'REVOKE ALL ON "{schema}".{table} FROM {role}')
    try:
        yield make_conninfo(database_url, user=role)
    finally:
        with psycopg.connect(database_url, autocommit=True) as admin:
            admin.execute(f"DROP OWNED BY {role}")
            admin.execute(f"DROP ROLE {role}")


async def test_a_service_refused_for_good_stops_the_worker_in_one_line_keeping_its_jobs(
    aqueue: leaseq.AsyncQueue, database_url: str, schema: str
) -> None:
    """The maintenance leader's reaper refused for good (a revoked grant on a table
    only it writes): the worker stopped as on a crash, with a 135-line traceback
    ("a worker service crashed") where the README promises one line, and the
    jobs its claim in flight had taken were left running until their leases
    ended. It now stops as on a signal: the error itself, and no job left running."""
    ids = await aqueue.enqueue_many("work", [{}] * 6)
    app = leaseq.App(schema=schema)

    @app.task("work")
    async def work(job: leaseq.JobContext) -> None:
        await asyncio.sleep(0.3)

    with _role_without(database_url, schema, "key_hold") as url:
        worker = leaseq.Worker(app, dsn=url, concurrency=3, poll_interval=0.1, maintenance=True)
        with pytest.raises(leaseq.DatabaseError) as refused:
            await asyncio.wait_for(worker.run(), 60)
    assert refused.value.sqlstate == "42501"  # insufficient privilege, said as it is
    statuses = {(await aqueue.get(job_id)).status for job_id in ids}
    assert JobStatus.RUNNING not in statuses  # completed, or given back
