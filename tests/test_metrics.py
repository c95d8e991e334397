"""Prometheus metrics: after a known workload run by a real Worker, the scraped numbers
are exactly the workload's; the database gauges match a known table state, read at
most once per TTL."""

from __future__ import annotations

import asyncio
import threading
import time
import urllib.request
from collections.abc import Awaitable, Callable

import psycopg
import pytest
from prometheus_client.parser import text_string_to_metric_families

import leaseq
from leaseq import JobStatus, QueueStats
from leaseq.testing import aset_clock_offset, set_clock_offset

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def _samples(text: str) -> Samples:
    """Every sample of an exposition, by name and sorted labels."""
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def _value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def _scrape(port: int) -> Samples:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        return _samples(response.read().decode())


async def _until(condition: Callable[[], Awaitable[bool] | bool], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        result = condition()
        if isinstance(result, Awaitable):
            result = await result
        if result:
            return
        if time.monotonic() > deadline:
            pytest.fail("condition not reached in time")
        await asyncio.sleep(0.05)


@pytest.mark.asyncio
async def test_a_known_workload_scrapes_as_exactly_its_numbers(
    database_url: str, schema: str
) -> None:
    """7 done, 3 retried once then done, 2 failed, 1 recovered lease (then done), one
    lease lost (the row locked and the clock moved past it), one released at shutdown."""
    ok, flaky, broken = 7, 3, 2
    metrics = leaseq.Metrics()  # a registry of its own, for exact numbers
    server = metrics.serve(0)
    app = leaseq.App(schema=schema)
    slow_started = asyncio.Event()

    @app.task("work", backoff=(0, 0))
    async def work(job: leaseq.JobContext) -> None:
        if job.payload["kind"] == "flaky" and job.attempts == 1:
            raise RuntimeError("try again")
        if job.payload["kind"] == "broken":
            raise leaseq.PermanentError("bad input")

    @app.task("slow", lease=5)
    async def slow(job: leaseq.JobContext) -> None:
        slow_started.set()
        await asyncio.sleep(60)  # cancelled when its lease is lost

    @app.task("hang")
    async def hang(job: leaseq.JobContext) -> None:
        await asyncio.sleep(60)  # cancelled and released at shutdown

    async with leaseq.AsyncQueue(database_url, schema=schema, metrics=metrics) as producer:
        await producer.migrate()
        kinds = ["ok"] * ok + ["flaky"] * flaky + ["broken"] * broken
        await producer.enqueue_many("work", [{"kind": k} for k in kinds])
        await producer.enqueue("work", {"kind": "ok"})
        (orphan,) = await producer.claim("work", lease=1)  # a worker that died
        assert orphan.payload == {"kind": "ok"}
        slow_id = await producer.enqueue("slow", {}, max_attempts=1)  # nobody reclaims it
        await producer.enqueue("hang", {})
        await asyncio.sleep(1.1)  # the orphan's lease is over
        worker = leaseq.Worker(
            app,
            dsn=database_url,
            concurrency=20,
            poll_interval=0.1,
            renew_fraction=0.3,
            shutdown_grace=0.5,
            maintenance=False,
            metrics=metrics,
        )
        task = asyncio.create_task(worker.run())
        loop = asyncio.get_running_loop()

        async def work_done() -> bool:
            (stats,) = await producer.stats("work")
            return stats.queued == 0 and stats.running == 0

        await _until(work_done)
        await asyncio.wait_for(slow_started.wait(), 10)
        running = await loop.run_in_executor(None, _scrape, server.port)
        assert _value(running, "leaseq_worker_running_jobs") == 2  # slow and hang

        async with producer.connection() as blocker, blocker.transaction():
            await blocker.execute(
                f'SELECT 1 FROM "{schema}".job WHERE job_id = %s FOR UPDATE', (slow_id,)
            )
            await aset_clock_offset(producer, 6)  # the 5 s lease is over
            await _until(lambda: worker.stats.lost_leases >= 1)
        worker.request_stop()
        await asyncio.wait_for(task, 30)

    samples = await loop.run_in_executor(None, _scrape, server.port)
    server.close()

    def finished(queue: str, outcome: str) -> float:
        return _value(samples, "leaseq_jobs_finished_total", queue=queue, outcome=outcome)

    assert _value(samples, "leaseq_jobs_enqueued_total", queue="work") == ok + flaky + broken + 1
    assert _value(samples, "leaseq_jobs_enqueued_total", queue="slow") == 1
    assert _value(samples, "leaseq_jobs_enqueued_total", queue="hang") == 1
    assert {o: finished("work", o) for o in leaseq._metrics.OUTCOMES} == {
        "done": ok + flaky + 1,
        "retried": flaky,
        "failed": broken,
        "released": 0,
        "lease_lost": 0,
    }
    assert finished("slow", "lease_lost") == 1
    assert finished("slow", "done") == 0
    assert finished("hang", "released") == 1
    assert _value(samples, "leaseq_leases_recovered_total", queue="work") == 1
    assert _value(samples, "leaseq_leases_recovered_total", queue="slow") == 0
    attempts = ok + 2 * flaky + broken + 1
    assert _value(samples, "leaseq_job_duration_seconds_count", queue="work") == attempts
    assert _value(samples, "leaseq_job_wait_seconds_count", queue="work") == attempts
    # The orphan waited from its lease's end (1 s after its claim) to its recovery.
    assert _value(samples, "leaseq_job_wait_seconds_sum", queue="work") > 0
    claims = sum(
        _value(samples, "leaseq_claim_statements_total", queue=q) for q in ("work", "slow", "hang")
    )
    assert claims == worker.stats.claim_statements
    assert _value(samples, "leaseq_claim_duration_seconds_count", queue="work") == _value(
        samples, "leaseq_claim_statements_total", queue="work"
    )
    assert _value(samples, "leaseq_worker_running_jobs") == 0
    # What the worker's own stats say, and the Prometheus view of them, agree.
    assert worker.stats.completed == ok + flaky + 1
    assert (worker.stats.retried, worker.stats.failed) == (flaky, broken)
    assert (worker.stats.released, worker.stats.lost_leases) == (1, 1)


def test_database_gauges_match_a_known_table_state(queue: leaseq.Queue) -> None:
    metrics = leaseq.Metrics()
    metrics.watch(queue, ttl=0)
    queue.enqueue_many("reports", [{"n": n} for n in range(4)])  # 7 bytes each
    queue.enqueue("reports", {"later": True}, delay=3600)  # queued, not ready
    done, expired = queue.claim("reports", limit=2, lease=5)
    queue.complete(done)
    queue.enqueue("empty", {"n": 0})
    queue.cancel(queue.claim("empty", lease=5)[0].job_id)  # running: not cancelled
    set_clock_offset(queue, 30)
    samples = _samples(metrics.text())

    def gauge(name: str, **labels: str) -> float:
        key = (name, tuple(sorted(labels.items())))
        assert key in samples, key
        return samples[key]

    assert gauge("leaseq_queue_stats_up") == 1
    states = {
        s.value: gauge("leaseq_queue_jobs", queue="reports", state=s.value) for s in JobStatus
    }
    assert states == {"queued": 3, "running": 1, "done": 1, "failed": 0, "cancelled": 0}
    for state in JobStatus:  # a small table: every count exact
        assert gauge("leaseq_queue_jobs_estimated", queue="reports", state=state.value) == 0
    assert gauge("leaseq_queue_bytes", queue="reports") == 2 * len('{"n":0}') + len(
        '{"later":true}'
    )
    assert 30 <= gauge("leaseq_queue_oldest_ready_age_seconds", queue="reports") < 120
    assert gauge("leaseq_queue_expired_leases", queue="reports") == 1
    assert gauge("leaseq_queue_jobs", queue="empty", state="running") == 1
    assert gauge("leaseq_queue_oldest_ready_age_seconds", queue="empty") == 0
    assert gauge("leaseq_queue_expired_leases", queue="empty") == 1
    assert gauge("leaseq_queue_paused", queue="reports") == 0
    del expired


def test_a_paused_queue_has_no_ready_age_and_says_it_is_paused(queue: leaseq.Queue) -> None:
    """Its jobs wait by the operator's choice: "work waits" (the oldest ready age
    past an alert's bound) must not page anyone. It grew as if no worker ran."""
    metrics = leaseq.Metrics()
    metrics.watch(queue, ttl=0)
    queue.enqueue_many("reports", [{"n": n} for n in range(3)])
    queue.configure_queue("reports", paused=True)
    set_clock_offset(queue, 600)
    assert queue.claim("reports") == []  # nothing a worker could claim now
    (stats,) = queue.stats("reports")
    assert stats.paused
    assert stats.counts[JobStatus.QUEUED] == 3
    assert stats.oldest_ready_age is None
    samples = _samples(metrics.text())
    labels = (("queue", "reports"),)
    assert samples[("leaseq_queue_oldest_ready_age_seconds", labels)] == 0
    assert samples[("leaseq_queue_paused", labels)] == 1
    queue.configure_queue("reports", paused=False)
    (stats,) = queue.stats("reports")
    assert stats.oldest_ready_age is not None
    assert stats.oldest_ready_age >= 600
    samples = _samples(metrics.text())
    assert samples[("leaseq_queue_oldest_ready_age_seconds", labels)] >= 600
    assert samples[("leaseq_queue_paused", labels)] == 0


def test_table_gauges_say_dead_rows_size_and_what_holds_cleanup_back(
    queue: leaseq.Queue, database_url: str
) -> None:
    metrics = leaseq.Metrics()
    metrics.watch(queue, ttl=0)
    ids = queue.enqueue_many("reports", [{"n": n} for n in range(50)])
    queue.complete_many(queue.claim("reports", limit=50))
    job = queue.health().table("job")
    assert job is not None
    assert len(ids) == 50
    samples = _samples(metrics.text())
    assert _value(samples, "leaseq_job_table_bytes") == job.total_bytes
    assert _value(samples, "leaseq_job_table_dead_tuples") >= 0
    with psycopg.connect(database_url, autocommit=True) as holder:
        holder.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        holder.execute("SELECT 1")  # a snapshot, then idle in transaction
        time.sleep(1.1)
        held = _value(_samples(metrics.text()), "leaseq_cleanup_held_back_seconds")
        holder.execute("ROLLBACK")
    assert held >= 1.0


class CountingSource:
    def __init__(self, queue: leaseq.Queue) -> None:
        self.queue = queue
        self.calls = 0
        self.lock = threading.Lock()

    def stats(self, queue: str | None = None) -> list[QueueStats]:
        with self.lock:
            self.calls += 1
        return self.queue.stats(queue)

    def health(self, *, long_transaction: float = 60.0) -> leaseq.Health:
        return self.queue.health(long_transaction=long_transaction)


def test_scrapes_share_one_stats_query_per_ttl(queue: leaseq.Queue) -> None:
    queue.enqueue("reports", {"n": 1})
    metrics = leaseq.Metrics()
    source = CountingSource(queue)
    metrics.watch(source, ttl=0.5)
    server = metrics.serve(0)
    try:
        threads = [threading.Thread(target=_scrape, args=(server.port,)) for _ in range(5)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(10)
        assert source.calls == 1
        _samples(metrics.text())
        assert source.calls == 1
        time.sleep(0.6)
        queue.enqueue("reports", {"n": 2})
        samples = _scrape(server.port)
        assert source.calls == 2
        assert _value(samples, "leaseq_queue_jobs", queue="reports", state="queued") == 2
    finally:
        server.close()


class SlowSource(CountingSource):
    """A database slower than the ttl: each read takes longer than the ttl."""

    def stats(self, queue: str | None = None) -> list[QueueStats]:
        time.sleep(0.4)
        return super().stats(queue)


def test_scrapes_waiting_for_a_read_slower_than_the_ttl_share_it(queue: leaseq.Queue) -> None:
    queue.enqueue("reports", {"n": 1})
    metrics = leaseq.Metrics()
    source = SlowSource(queue)
    metrics.watch(source, ttl=0.2)
    server = metrics.serve(0)
    try:
        threads = [threading.Thread(target=_scrape, args=(server.port,)) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(10)
        # Four scrapes arrived together: the ones that waited behind the first read
        # were served its numbers, not a read each, back to back.
        assert source.calls == 1
    finally:
        server.close()


def test_a_failing_stats_query_says_so_and_serves_no_stale_numbers(queue: leaseq.Queue) -> None:
    class Broken:
        def stats(self, queue: str | None = None) -> list[QueueStats]:
            raise leaseq.DatabaseUnavailable("no database")

        def health(self, *, long_transaction: float = 60.0) -> leaseq.Health:
            raise leaseq.DatabaseUnavailable("no database")

    metrics = leaseq.Metrics()
    metrics.watch(queue, ttl=0)
    queue.enqueue("reports", {"n": 1})
    assert _value(_samples(metrics.text()), "leaseq_queue_stats_up") == 1
    metrics.watch(Broken(), ttl=0)
    samples = _samples(metrics.text())
    assert _value(samples, "leaseq_queue_stats_up") == 0
    assert not [key for key in samples if key[0] == "leaseq_queue_jobs"]


def test_enqueues_are_counted_by_the_producer(database_url: str, schema: str) -> None:
    metrics = leaseq.Metrics()
    with leaseq.Queue(database_url, schema=schema, metrics=metrics) as producer:
        producer.migrate()
        producer.enqueue("reports", {"n": 0})
        producer.enqueue_many("reports", [{"n": n} for n in range(4)])
        producer.enqueue_many("reports", [])
        with pytest.raises(leaseq.InvalidJob):
            producer.enqueue("reports", {"bad": float("nan")})  # nothing written
    samples = _samples(metrics.text())
    assert _value(samples, "leaseq_jobs_enqueued_total", queue="reports") == 5
    with leaseq.Queue(database_url, schema=schema, metrics=None) as quiet:
        quiet.enqueue("reports", {"n": 5})
    assert _value(_samples(metrics.text()), "leaseq_jobs_enqueued_total", queue="reports") == 5


def test_labels_never_carry_a_job_id() -> None:
    allowed = {"queue", "task", "outcome", "state"}
    metrics = leaseq.Metrics()
    metrics.queue("reports")
    for family in text_string_to_metric_families(metrics.text()):
        assert family.name.startswith("leaseq_")
        for sample in family.samples:
            assert set(sample.labels) <= allowed | {"le"}, sample


def test_metrics_refuse_what_they_cannot_use() -> None:
    from prometheus_client import CollectorRegistry

    with pytest.raises(leaseq.InvalidArgument, match="registry"):
        leaseq.Metrics("x")  # type: ignore[arg-type]
    metrics = leaseq.Metrics(CollectorRegistry())
    with pytest.raises(leaseq.InvalidArgument, match="watch"):
        metrics.watch(5)  # type: ignore[arg-type]
    with pytest.raises(leaseq.InvalidArgument, match="host"):
        metrics.serve(0, host=5)  # type: ignore[arg-type]
    with pytest.raises(leaseq.InvalidArgument, match="metrics"):
        leaseq.Queue("postgresql://nobody@127.0.0.1:1/none", metrics=CollectorRegistry())  # type: ignore[arg-type]


async def test_an_async_queue_cannot_be_watched(aqueue: leaseq.AsyncQueue) -> None:
    with pytest.raises(leaseq.InvalidArgument):
        leaseq.Metrics().watch(aqueue)  # type: ignore[arg-type]


@pytest.mark.parametrize("port", [-1, 65536, 70000, "9100", True, 9100.0], ids=repr)
def test_a_port_outside_0_to_65535_is_refused(port: object) -> None:
    """-1 raised socket.gaierror and 70000 OverflowError, from the socket."""
    with pytest.raises(leaseq.InvalidArgument, match="port"):
        leaseq.Metrics().serve(port)  # type: ignore[arg-type]


@pytest.mark.parametrize("ttl", [float("nan"), float("inf"), -1, "5", True], ids=repr)
def test_a_ttl_that_is_no_finite_number_of_seconds_is_refused(ttl: object) -> None:
    """NaN was taken: every scrape read the database (NaN compares false)."""
    with pytest.raises(leaseq.InvalidArgument, match="ttl"):
        leaseq.Metrics().watch(None, ttl=ttl)  # type: ignore[arg-type]


def _finished(metrics: leaseq.Metrics, queue: str) -> dict[str, float]:
    samples = _samples(metrics.text())
    return {
        outcome: _value(samples, "leaseq_jobs_finished_total", queue=queue, outcome=outcome)
        for outcome in leaseq._metrics.OUTCOMES
        if _value(samples, "leaseq_jobs_finished_total", queue=queue, outcome=outcome)
    }


@pytest.mark.asyncio
async def test_a_completion_committed_under_its_lease_after_the_local_deadline_is_done_only(
    database_url: str, schema: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The job's row is locked while job.transaction()'s completion waits for it,
    past the worker's local deadline (lease minus its margin) but not past the
    database lease: the completion commits. One attempt, done: never also counted
    (or logged) as a lost lease."""
    app = leaseq.App(schema=schema)
    go = threading.Event()

    @app.task("reports", lease=3)
    def report(job: leaseq.JobContext) -> None:
        go.wait(10)
        with job.transaction() as conn:
            conn.execute("SELECT 1")

    metrics = leaseq.Metrics()
    async with leaseq.AsyncQueue(database_url, schema=schema, metrics=None) as producer:
        await producer.migrate()
        job_id = await producer.enqueue("reports", {})
        worker = leaseq.Worker(
            app, dsn=database_url, poll_interval=0.1, maintenance=False, metrics=metrics
        )
        task = asyncio.create_task(worker.run())
        await _until(
            lambda: _status_is(producer, job_id, JobStatus.RUNNING),
        )
        async with producer.connection() as blocker, blocker.transaction():
            await blocker.execute(
                f'SELECT 1 FROM "{schema}".job WHERE job_id = %s FOR UPDATE', (job_id,)
            )
            go.set()
            await asyncio.sleep(2.7)  # past the local deadline, inside the lease
        await _until(lambda: _status_is(producer, job_id, JobStatus.DONE))
        await _until(lambda: worker.stats.completed == 1)
        worker.request_stop()
        await asyncio.wait_for(task, 30)
        job = await producer.get(job_id)
    assert (job.status, job.attempts) == (JobStatus.DONE, 1)
    assert _finished(metrics, "reports") == {"done": 1}
    assert (worker.stats.completed, worker.stats.lost_leases) == (1, 0)
    assert "lease lost" not in caplog.text


@pytest.mark.asyncio
@pytest.mark.parametrize("kind", ["sync", "async"])
async def test_a_completion_refused_by_the_fence_is_counted_lease_lost(
    database_url: str, schema: str, kind: str
) -> None:
    """The job's lease ran out and another claim took it while the handler worked;
    the handler's job.transaction() is refused (LeaseLost): one lost lease."""
    app = leaseq.App(schema=schema)
    go = threading.Event()
    refused: list[BaseException] = []

    if kind == "sync":

        @app.task("reports", lease=60)  # no renewal comes due during the test
        def report(job: leaseq.JobContext) -> None:
            go.wait(10)
            try:
                with job.transaction() as conn:
                    conn.execute("SELECT 1")
            except leaseq.LeaseLost as exc:
                refused.append(exc)
                raise

    else:

        @app.task("reports", lease=60)
        async def areport(job: leaseq.JobContext) -> None:
            await asyncio.to_thread(go.wait, 10)
            try:
                async with job.atransaction() as conn:
                    await conn.execute("SELECT 1")
            except leaseq.LeaseLost as exc:
                refused.append(exc)
                raise

    metrics = leaseq.Metrics()
    async with leaseq.AsyncQueue(database_url, schema=schema, metrics=None) as producer:
        await producer.migrate()
        job_id = await producer.enqueue("reports", {})
        worker = leaseq.Worker(
            app,
            dsn=database_url,
            concurrency=1,  # busy with the job: it never reclaims it itself
            poll_interval=0.1,
            maintenance=False,
            metrics=metrics,
        )
        task = asyncio.create_task(worker.run())
        await _until(lambda: _status_is(producer, job_id, JobStatus.RUNNING))
        await aset_clock_offset(producer, 61)  # the lease is over...
        (again,) = await producer.claim("reports", lease=60)  # ...and taken again
        assert again.job_id == job_id
        go.set()
        await _until(lambda: worker.stats.lost_leases == 1)
        worker.request_stop()
        await asyncio.wait_for(task, 30)
    assert len(refused) == 1
    assert _finished(metrics, "reports") == {"lease_lost": 1}
    assert (worker.stats.completed, worker.stats.lost_leases) == (0, 1)


@pytest.mark.asyncio
async def test_an_outcome_is_counted_before_its_hooks_even_one_cut_at_the_stop(
    database_url: str, schema: str
) -> None:
    """An on_success hook still running at a stop past the grace is cancelled; the
    job is done in the database, and counted done."""
    app = leaseq.App(schema=schema)
    hook_started = asyncio.Event()

    @app.on_success
    async def notify(job: leaseq.JobContext, result: object) -> None:
        hook_started.set()
        await asyncio.sleep(30)

    @app.task("reports")
    async def report(job: leaseq.JobContext) -> None:
        return None

    metrics = leaseq.Metrics()
    async with leaseq.AsyncQueue(database_url, schema=schema, metrics=None) as producer:
        await producer.migrate()
        job_id = await producer.enqueue("reports", {})
        worker = leaseq.Worker(
            app,
            dsn=database_url,
            poll_interval=0.1,
            maintenance=False,
            metrics=metrics,
            shutdown_grace=0.5,
        )
        task = asyncio.create_task(worker.run())
        await asyncio.wait_for(hook_started.wait(), 10)
        assert _finished(metrics, "reports") == {"done": 1}  # not after the hook
        worker.request_stop()
        await asyncio.wait_for(task, 30)
        assert (await producer.get(job_id)).status is JobStatus.DONE
    assert _finished(metrics, "reports") == {"done": 1}


async def _status_is(queue: leaseq.AsyncQueue, job_id: int, status: JobStatus) -> bool:
    return (await queue.get(job_id)).status is status


@pytest.mark.asyncio
async def test_an_asgi_scrape_waiting_for_the_database_never_holds_the_event_loop(
    database_url: str, schema: str
) -> None:
    """The job table is locked for 1.5 s (a migration, a VACUUM FULL): the gauges'
    read waits for it, and the application's event loop goes on meanwhile."""
    metrics = leaseq.Metrics()
    app = metrics.asgi_app()
    sent: list[dict[str, object]] = []

    async def receive() -> dict[str, object]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, object]) -> None:
        sent.append(message)

    locked = threading.Event()

    def lock_the_table() -> None:
        with psycopg.connect(database_url) as locker:
            locker.execute(f'LOCK TABLE "{schema}".job IN ACCESS EXCLUSIVE MODE')
            locked.set()
            time.sleep(1.5)

    with leaseq.Queue(database_url, schema=schema, metrics=None) as source:
        source.migrate()
        source.enqueue("reports", {})
        metrics.watch(source, ttl=0)
        locker = threading.Thread(target=lock_the_table)
        locker.start()
        assert locked.wait(10)
        scope = {"type": "http", "method": "GET", "path": "/", "headers": []}
        started = time.monotonic()
        scrape = asyncio.create_task(app(scope, receive, send))  # type: ignore[arg-type]
        longest_gap, last = 0.0, time.monotonic()
        while not scrape.done():  # the loop's own work, ticking while the scrape waits
            await asyncio.sleep(0.05)
            now = time.monotonic()
            longest_gap, last = max(longest_gap, now - last), now
        await scrape
        waited = time.monotonic() - started
        locker.join()
    assert waited >= 1.0  # the read did wait for the lock...
    assert longest_gap < 0.75  # ...and the loop was never held while it did
    assert sent[0]["status"] == 200
    body = sent[1]["body"]
    assert isinstance(body, bytes)
    samples = _samples(body.decode())
    assert _value(samples, "leaseq_queue_jobs", queue="reports", state="queued") == 1


@pytest.mark.asyncio
async def test_the_jobs_of_periodic_ticks_are_counted_enqueued(
    database_url: str, schema: str
) -> None:
    app = leaseq.App(schema=schema)
    app.periodic("heartbeat", queue="ticks", every=1)

    @app.task("ticks")
    async def tick(job: leaseq.JobContext) -> None:
        return None

    metrics = leaseq.Metrics()
    async with leaseq.AsyncQueue(database_url, schema=schema, metrics=None) as producer:
        await producer.migrate()
        worker = leaseq.Worker(
            app, dsn=database_url, poll_interval=0.1, maintenance=False, metrics=metrics
        )
        task = asyncio.create_task(worker.run())
        await _until(lambda: worker.stats.completed >= 2)
        worker.request_stop()
        await asyncio.wait_for(task, 30)
        jobs = await producer.find_jobs(queue="ticks", status=None)
    samples = _samples(metrics.text())
    assert len(jobs.jobs) >= 2
    assert _value(samples, "leaseq_jobs_enqueued_total", queue="ticks") == len(jobs.jobs)


@pytest.mark.asyncio
async def test_a_job_its_crashed_workers_left_failed_is_counted_failed(
    database_url: str, schema: str
) -> None:
    """Repeated crashes end in `failed` (contract 8), by the maintenance leader's
    hand: the jobs-fail alert must see it. No worker counted these jobs (their
    workers died), so the leader that failed them does, and only it."""
    app = leaseq.App(schema=schema)

    @app.task("crashy")
    async def crashy(job: leaseq.JobContext) -> None:
        return None

    metrics = leaseq.Metrics()
    async with leaseq.AsyncQueue(database_url, schema=schema, metrics=None) as producer:
        await producer.migrate()
        crashed = await producer.enqueue("crashy", {}, max_attempts=1)
        (claim,) = await producer.claim("crashy", lease=1)  # the worker that died with it
        assert claim.job_id == crashed
        await aset_clock_offset(producer, 5)  # its lease is over, with no attempt left
        worker = leaseq.Worker(
            app, dsn=database_url, poll_interval=0.1, maintenance_interval=0.1, metrics=metrics
        )
        task = asyncio.create_task(worker.run())

        async def failed() -> bool:
            return (await producer.get(crashed)).status is JobStatus.FAILED

        await _until(failed)
        worker.request_stop()
        await asyncio.wait_for(task, 30)
    samples = _samples(metrics.text())
    outcomes = {
        o: _value(samples, "leaseq_jobs_finished_total", queue="crashy", outcome=o)
        for o in leaseq._metrics.OUTCOMES
    }
    assert outcomes == {"done": 0, "retried": 0, "failed": 1, "released": 0, "lease_lost": 0}
