"""Job results: a handler's return value, stored by its own fenced completion and
read back with ``result()`` / ``wait_result()``, for as long as the job is kept."""

from __future__ import annotations

import asyncio
import functools
import threading
import time
from typing import Any

import pytest

import leaseq
from leaseq import JobStatus

from .clients import Client
from .conftest import Clock
from .test_worker import Running, _all_finished, _until


def _claim(client: Client, queue: str = "reports") -> leaseq.Claim:
    (claim,) = client.claim(queue)
    return claim


def test_a_completion_stores_its_result(client: Client) -> None:
    job_id = client.enqueue("reports", {"n": 1})
    with pytest.raises(leaseq.ResultNotReady):
        client.result(job_id)  # queued
    claim = _claim(client)
    with pytest.raises(leaseq.ResultNotReady):
        client.result(job_id)  # running
    client.complete(claim, result={"pages": 3, "title": "Q3 ✓"})
    assert client.result(job_id) == {"pages": 3, "title": "Q3 ✓"}


def test_a_job_completed_without_a_result_reads_none(client: Client) -> None:
    job_id = client.enqueue("reports", {})
    client.complete(_claim(client))
    assert client.result(job_id) is None


def test_a_batch_stores_each_claims_own_result(client: Client) -> None:
    ids = client.enqueue_many("reports", [{"n": n} for n in range(3)])
    claims = client.claim("reports", limit=3)
    by_id = {c.job_id: c for c in claims}
    answers = client.complete_many(
        [by_id[ids[0]], by_id[ids[1]], by_id[ids[2]]], results=[[1], None, "three"]
    )
    assert all(accepted for _, accepted in answers)
    assert [client.result(i) for i in ids] == [[1], None, "three"]


def test_a_stale_claims_result_is_refused_and_the_new_claims_stands(
    client: Client, clock: Clock
) -> None:
    """The lease expired, another worker took the job and completed it with its
    result: the first worker's late completion (with its own result) is refused
    and changes nothing."""
    job_id = client.enqueue("reports", {})
    stale = _claim(client)
    clock.advance(stale.lease_seconds + 1)
    fresh = _claim(client)
    client.complete(fresh, result="fresh")
    with pytest.raises(leaseq.LeaseLost):
        client.complete(stale, result="stale")
    assert client.result(job_id) == "fresh"


def test_a_resent_completion_keeps_the_first_result(client: Client) -> None:
    """A resend after an ambiguous commit is accepted and writes nothing new."""
    job_id = client.enqueue("reports", {})
    claim = _claim(client)
    client.complete(claim, result="first")
    client.complete(claim, result="second")
    assert client.result(job_id) == "first"


def test_a_failed_or_cancelled_job_has_no_result(client: Client) -> None:
    failed = client.enqueue("reports", {})
    client.fail(_claim(client), error="upstream broke")
    with pytest.raises(leaseq.JobFailed) as info:
        client.result(failed)
    assert (info.value.status, info.value.error, info.value.job_id) == (
        "failed",
        "upstream broke",
        failed,
    )
    cancelled = client.enqueue("reports", {})
    assert client.cancel(cancelled)
    with pytest.raises(leaseq.JobFailed) as info:
        client.result(cancelled)
    assert info.value.status == "cancelled"
    with pytest.raises(leaseq.JobNotFound):
        client.result(10**12)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ({"blob": "x" * 70_000}, "too large"),
        ({1, 2}, "cannot be stored"),
        ("nul \x00 byte", "NUL"),
        ({"deep": functools.reduce(lambda inner, _: [inner], range(256), [])}, "nests deeper"),
    ],
)
def test_a_result_that_cannot_be_stored_is_refused_and_writes_nothing(
    client: Client, value: Any, message: str
) -> None:
    job_id = client.enqueue("reports", {})
    claim = _claim(client)
    with pytest.raises(leaseq.InvalidResult, match=message) as refused:
        client.complete(claim, result=value)
    assert "payload" not in str(refused.value)  # the result is what was refused
    assert client.get(job_id).status is JobStatus.RUNNING
    client.complete(claim, result="fine")
    assert client.result(job_id) == "fine"


def test_results_follow_the_jobs_retention(client: Client, clock: Clock) -> None:
    """Archived, the result is still read; deleted, the job is gone."""
    client.configure_queue("kept", retention_mode="archive", retain_done=60)
    client.configure_queue("dropped", retain_done=60)
    kept = client.enqueue("kept", {})
    client.complete(_claim(client, "kept"), result={"kept": True})
    dropped = client.enqueue("dropped", {})
    client.complete(_claim(client, "dropped"), result={"kept": False})
    clock.advance(61)
    client.prune()
    assert client.result(kept) == {"kept": True}
    # The waiter is told why a job it saw enqueued may be gone.
    with pytest.raises(leaseq.JobNotFound, match="removed by retention"):
        client.result(dropped)


def test_wait_result_returns_once_the_job_finishes(client: Client) -> None:
    job_id = client.enqueue("reports", {})
    claim = _claim(client)
    finisher = threading.Timer(0.3, lambda: client.complete(claim, result=42))
    finisher.start()
    try:
        # A poll interval far longer than the test: only the notification wakes it.
        assert client.wait_result(job_id, timeout=30, poll_interval=3600) == 42
    finally:
        finisher.join()


def test_wait_result_raises_the_jobs_failure(client: Client) -> None:
    job_id = client.enqueue("reports", {})
    claim = _claim(client)
    finisher = threading.Timer(0.3, lambda: client.fail(claim, error="no data"))
    finisher.start()
    try:
        with pytest.raises(leaseq.JobFailed, match="no data"):
            client.wait_result(job_id, timeout=30, poll_interval=3600)
    finally:
        finisher.join()


def test_wait_result_hears_a_retry_that_fails_the_job_on_its_last_attempt(
    client: Client,
) -> None:
    job_id = client.enqueue("reports", {}, max_attempts=1)
    claim = _claim(client)
    finisher = threading.Timer(0.3, lambda: client.retry(claim, error="upstream down"))
    finisher.start()
    try:
        # No poll within the wait: only the notification can wake it before its
        # timeout (after it, the last look would find the failure all the same).
        started = time.monotonic()
        with pytest.raises(leaseq.JobFailed, match="upstream down"):
            client.wait_result(job_id, timeout=60, poll_interval=3600)
        assert time.monotonic() - started < 30
    finally:
        finisher.join()


def test_wait_result_hears_the_reaper_fail_a_job_whose_last_lease_expired(
    client: Client, clock: Clock
) -> None:
    job_id = client.enqueue("reports", {}, max_attempts=1)
    claim = _claim(client)
    clock.advance(claim.lease_seconds + 1)  # its worker died on the last attempt
    reaper = threading.Timer(0.3, client.reap)
    reaper.start()
    try:
        # No poll within the wait: only the notification can wake it before its
        # timeout (after it, the last look would find the failure all the same).
        started = time.monotonic()
        with pytest.raises(leaseq.JobFailed, match="lease expired"):
            client.wait_result(job_id, timeout=60, poll_interval=3600)
        assert time.monotonic() - started < 30
    finally:
        reaper.join()


def test_wait_result_times_out(client: Client) -> None:
    job_id = client.enqueue("reports", {})
    started = time.monotonic()
    with pytest.raises(TimeoutError):
        client.wait_result(job_id, timeout=0.5, poll_interval=0.1)
    assert time.monotonic() - started >= 0.5


def test_wait_result_polls_when_nothing_notifies(client: Client) -> None:
    """A cancel sends no result notification: the poll finds it."""
    job_id = client.enqueue("reports", {})
    canceller = threading.Timer(0.2, lambda: client.cancel(job_id))
    canceller.start()
    try:
        with pytest.raises(leaseq.JobFailed, match="cancelled"):
            client.wait_result(job_id, timeout=30, poll_interval=0.2)
    finally:
        canceller.join()


def test_bad_wait_arguments_are_refused(client: Client) -> None:
    job_id = client.enqueue("reports", {})
    with pytest.raises(leaseq.InvalidArgument):
        client.wait_result(job_id, timeout=-1)
    with pytest.raises(leaseq.InvalidArgument):
        client.wait_result(job_id, poll_interval=0)


# -- through a worker ------------------------------------------------------------


@pytest.mark.asyncio
async def test_a_handlers_return_value_is_its_jobs_result(
    aqueue: leaseq.AsyncQueue, database_url: str, schema: str
) -> None:
    app = leaseq.App(schema=schema)

    @app.task("reports")
    async def report(job: leaseq.JobContext) -> dict[str, Any]:
        return {"pages": job.payload["n"] * 2}

    @app.task("sums")
    def add(job: leaseq.JobContext) -> int:
        return int(sum(job.payload))

    running = Running(leaseq.Worker(app, dsn=database_url, poll_interval=0.1, maintenance=False))
    try:
        report_id = await aqueue.enqueue("reports", {"n": 21})
        sum_id = await aqueue.enqueue("sums", [1, 2, 3])
        assert await aqueue.wait_result(report_id, timeout=30) == {"pages": 42}
        assert await aqueue.wait_result(sum_id, timeout=30) == 6
    finally:
        await running.stop()


@pytest.mark.asyncio
async def test_a_result_over_its_tasks_cap_fails_the_job(
    aqueue: leaseq.AsyncQueue, database_url: str, schema: str
) -> None:
    app = leaseq.App(schema=schema)

    @app.task("reports", max_result_bytes=100)
    async def report(job: leaseq.JobContext) -> str:
        return "x" * 200

    @app.task("objects")
    async def unstorable(job: leaseq.JobContext) -> object:
        return object()

    running = Running(leaseq.Worker(app, dsn=database_url, poll_interval=0.1, maintenance=False))
    try:
        big = await aqueue.enqueue("reports", {})
        odd = await aqueue.enqueue("objects", {})
        await _until(lambda: _all_finished(aqueue, "reports"))
        await _until(lambda: _all_finished(aqueue, "objects"))
    finally:
        await running.stop()
    for job_id, text in ((big, "too large"), (odd, "cannot be stored")):
        job = await aqueue.get(job_id)
        # Failed at once: the same handler would return the same value again.
        assert (job.status, job.attempts) == (JobStatus.FAILED, 1)
        assert job.last_error is not None
        assert text in job.last_error


@pytest.mark.asyncio
async def test_a_transactional_handler_stores_the_result_it_sets(
    aqueue: leaseq.AsyncQueue, database_url: str, schema: str
) -> None:
    app = leaseq.App(schema=schema)

    @app.task("reports")
    async def report(job: leaseq.JobContext) -> None:
        async with job.atransaction() as conn:
            await conn.execute("SELECT 1")
            job.result = {"written": True}

    running = Running(leaseq.Worker(app, dsn=database_url, poll_interval=0.1, maintenance=False))
    try:
        job_id = await aqueue.enqueue("reports", {})
        assert await aqueue.wait_result(job_id, timeout=30) == {"written": True}
    finally:
        await running.stop()


@pytest.mark.asyncio
async def test_a_transactional_handlers_result_is_held_to_its_tasks_cap(
    aqueue: leaseq.AsyncQueue, database_url: str, schema: str, connect: Any
) -> None:
    """``job.result`` set inside job.transaction() was checked against the 64 KiB
    default, not the task's max_result_bytes: a task capped at 100 bytes stored
    200, and one allowing 200 kB could not store 100 kB (its effect rolled back)."""
    with connect(autocommit=True) as conn:
        conn.execute(f'CREATE TABLE "{schema}".effect (job_id bigint)')
    app = leaseq.App(schema=schema)

    @app.task("small", max_result_bytes=100)
    def small(job: leaseq.JobContext) -> None:
        with job.transaction() as conn:
            conn.execute(f'INSERT INTO "{schema}".effect VALUES (%s)', (job.job_id,))
            job.result = "x" * 200

    @app.task("large", max_result_bytes=200_000)
    async def large(job: leaseq.JobContext) -> None:
        async with job.atransaction() as conn:
            await conn.execute(f'INSERT INTO "{schema}".effect VALUES (%s)', (job.job_id,))
            job.result = "y" * 100_000

    running = Running(leaseq.Worker(app, dsn=database_url, poll_interval=0.1, maintenance=False))
    try:
        over = await aqueue.enqueue("small", {})
        within = await aqueue.enqueue("large", {})
        assert await aqueue.wait_result(within, timeout=30) == "y" * 100_000
        with pytest.raises(leaseq.JobFailed) as failed:
            await aqueue.wait_result(over, timeout=30)
    finally:
        await running.stop()
    assert "the limit is 100" in (failed.value.error or "")
    assert (await aqueue.get(over)).attempts == 1  # failed at once: it would set it again
    with connect() as conn:
        effects = conn.execute(f'SELECT job_id FROM "{schema}".effect').fetchall()
    assert effects == [(within,)]  # the refused one's effect rolled back with it


@pytest.mark.asyncio
async def test_many_waiters_are_woken_by_their_own_jobs(
    aqueue: leaseq.AsyncQueue, database_url: str, schema: str
) -> None:
    app = leaseq.App(schema=schema)

    @app.task("reports")
    async def report(job: leaseq.JobContext) -> int:
        await asyncio.sleep(0.01 * job.payload["n"])
        return int(job.payload["n"])

    ids = await aqueue.enqueue_many("reports", [{"n": n} for n in range(20)])
    running = Running(
        leaseq.Worker(app, dsn=database_url, concurrency=5, poll_interval=0.1, maintenance=False)
    )
    try:
        results = await asyncio.gather(
            *(aqueue.wait_result(i, timeout=30, poll_interval=3600) for i in ids)
        )
    finally:
        await running.stop()
    assert results == list(range(20))


def test_only_a_job_someone_waits_for_notifies_its_end(queue: leaseq.Queue, connect: Any) -> None:
    """A completion nobody waits for sends no notification (its commit never
    queues for the server's notification lock); one that wait_result marked does,
    naming the job."""
    listener = connect(autocommit=True)
    listener.execute(f'LISTEN "{queue._store.results_channel}"')
    unwatched = queue.enqueue("reports", {})
    queue.complete(_claim(queue), result=1)
    assert list(listener.notifies(timeout=0.5)) == []
    watched = queue.enqueue("reports", {})
    claim = _claim(queue)
    queue._db.run(queue._store.await_result(watched))
    queue.complete(claim, result=2)
    heard = [n.payload for n in listener.notifies(timeout=5, stop_after=1)]
    assert heard == [str(watched)]
    assert (queue.result(unwatched), queue.result(watched)) == (1, 2)


@pytest.mark.asyncio
async def test_many_waiters_share_one_listening_connection(
    aqueue: leaseq.AsyncQueue, connect: Any
) -> None:
    """Waiters must not each take a server connection of their own: a web app
    with a few hundred requests waiting on results would use up the server's
    max_connections and lock its workers out."""
    ids = await aqueue.enqueue_many("reports", [{"n": n} for n in range(12)])
    channel = aqueue._store.results_channel
    waiters = [asyncio.create_task(aqueue.wait_result(i, timeout=30)) for i in ids]
    with connect(autocommit=True) as probe:

        def listening() -> int:
            row = probe.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE pid <> pg_backend_pid()"
                " AND query LIKE %s",
                (f"LISTEN %{channel}%",),
            ).fetchone()
            return int(row[0]) if row else 0

        deadline = time.monotonic() + 10
        while listening() == 0 and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.2)  # every waiter had its turn to start listening
        assert listening() == 1
    claims = await aqueue.claim("reports", limit=len(ids))
    await aqueue.complete_many(claims, results=[c.payload["n"] for c in claims])
    assert sorted(await asyncio.gather(*waiters)) == list(range(len(ids)))


def test_many_sync_waiters_share_one_listening_connection(
    queue: leaseq.Queue, connect: Any
) -> None:
    """As for the async client: threads waiting on results share one LISTEN
    connection, not one server connection each."""
    ids = queue.enqueue_many("reports", [{"n": n} for n in range(8)])
    channel = queue._store.results_channel
    results: dict[int, Any] = {}

    def wait(job_id: int) -> None:
        results[job_id] = queue.wait_result(job_id, timeout=30)

    waiters = [threading.Thread(target=wait, args=(i,)) for i in ids]
    for waiter in waiters:
        waiter.start()
    with connect(autocommit=True) as probe:

        def listening() -> int:
            row = probe.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE pid <> pg_backend_pid()"
                " AND query LIKE %s",
                (f"LISTEN %{channel}%",),
            ).fetchone()
            return int(row[0]) if row else 0

        deadline = time.monotonic() + 10
        while listening() == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.2)  # every waiter had its turn to start listening
        assert listening() == 1
    claims = queue.claim("reports", limit=len(ids))
    queue.complete_many(claims, results=[c.payload["n"] for c in claims])
    for waiter in waiters:
        waiter.join(30)
    assert sorted(results.values()) == list(range(len(ids)))


def test_wait_result_keeps_its_timeout_while_the_jobs_row_is_locked(
    queue: leaseq.Queue, connect: Any, schema: str
) -> None:
    """A transaction holding the job's row (a handler completing in its own
    transaction, an operator's UPDATE) must not hold wait_result past its timeout:
    it raises TimeoutError while the lock is still held."""
    job = queue.enqueue("reports", {})
    raised: list[BaseException] = []

    def wait() -> None:
        try:
            queue.wait_result(job, timeout=0.3)
        except BaseException as exc:
            raised.append(exc)

    with connect() as locker:
        locker.execute(f'SELECT 1 FROM "{schema}".job WHERE job_id = %s FOR UPDATE', (job,))
        waiter = threading.Thread(target=wait)
        waiter.start()
        waiter.join(20)
        returned_while_locked = not waiter.is_alive()
    waiter.join(30)
    assert returned_while_locked
    assert [type(exc) for exc in raised] == [TimeoutError]


def test_wait_result_hears_a_job_whose_row_was_locked_when_it_began(
    queue: leaseq.Queue, connect: Any, schema: str
) -> None:
    """A waiter that began while the row was locked still gets the result."""
    job = queue.enqueue("reports", {})
    results: list[Any] = []
    with connect() as locker:
        locker.execute(f'SELECT 1 FROM "{schema}".job WHERE job_id = %s FOR UPDATE', (job,))
        waiter = threading.Thread(
            target=lambda: results.append(queue.wait_result(job, timeout=30, poll_interval=0.2))
        )
        waiter.start()
        time.sleep(0.3)  # the waiter began while the row was locked
    queue.complete(_claim(queue), result="done")
    waiter.join(30)
    assert results == ["done"]


@pytest.mark.parametrize("running", [False, True])
def test_wait_result_hears_a_cancel(queue: leaseq.Queue, running: bool) -> None:
    """A cancelled job ends its waiters' wait with JobFailed when it is cancelled,
    not at their next look (an hour later with poll_interval=3600)."""
    job = queue.enqueue("reports", {})
    if running:
        _claim(queue)
    raised: list[BaseException] = []

    def wait() -> None:
        try:
            queue.wait_result(job, timeout=30, poll_interval=3600)
        except BaseException as exc:
            raised.append(exc)

    waiter = threading.Thread(target=wait)
    waiter.start()
    deadline = time.monotonic() + 10
    while not _marked(queue, job) and time.monotonic() < deadline:  # the waiter listens
        time.sleep(0.02)
    assert queue.cancel(job, running=running)
    waiter.join(10)  # bounded: a waiter that heard nothing sits out its 30 s timeout
    finished_in_time = not waiter.is_alive()
    waiter.join(40)
    assert finished_in_time
    assert [type(exc) for exc in raised] == [leaseq.JobFailed]


def _marked(queue: leaseq.Queue, job_id: int) -> bool:
    with queue.connection() as conn:
        row = conn.execute(
            f'SELECT result_awaited FROM "{queue._store.schema}".job WHERE job_id = %s', (job_id,)
        ).fetchone()
    return bool(row and row[0])
