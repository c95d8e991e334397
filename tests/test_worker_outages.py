"""The worker through database outages, as an operator meets them: a blackholed
database at the stop, killed service connections mid-drain, what the logs say."""

from __future__ import annotations

import asyncio
import logging
import threading
import time

import pytest

import leaseq
from leaseq._worker import runner

from .frozen_proxy import frozen_proxy

pytestmark = pytest.mark.asyncio


async def _until(condition: object, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not callable(condition) or not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"not reached in time: {what}")
        await asyncio.sleep(0.05)


async def test_a_stop_with_a_claim_hung_on_a_silent_database_keeps_the_documented_bound(
    aqueue: leaseq.AsyncQueue, database_url: str, schema: str
) -> None:
    """README: with the database unreachable at the stop, the grace, then 10 s at
    most for the releases and 5 more to close the connections. The claim in
    flight at the stop gets the grace, then is cancelled: its cancellation must
    not wait on the silent server too (psycopg waits 5 s for the cancel request,
    then 5 s for the query to end), or a container's SIGKILL comes first."""
    app = leaseq.App(schema=schema)
    started = asyncio.Event()

    @app.task("work", lease=60)
    async def work(job: leaseq.JobContext) -> None:
        started.set()
        await asyncio.sleep(30)

    await aqueue.enqueue("work", {})
    with frozen_proxy(database_url) as proxy:
        worker = leaseq.Worker(
            app,
            dsn=proxy.url,
            concurrency=2,  # a free slot: the worker polls for it
            poll_interval=0.1,
            shutdown_grace=1,
            maintenance=False,
            metrics=None,
        )
        running = asyncio.create_task(worker.run())
        await asyncio.wait_for(started.wait(), 30)
        proxy.frozen.set()
        claims = worker._claims
        assert claims is not None
        # A claim for the free slot goes out and never comes back.
        await _until(lambda: claims._claiming is not None, "a claim in flight")
        stopped_at = time.monotonic()
        worker.request_stop()
        await asyncio.wait_for(running, 90)
        took = time.monotonic() - stopped_at
    # The grace, the releases (10 s) and a second for stragglers, the close (5 s); slack.
    assert took < 1 + 10 + 1 + 5 + 3, took


async def test_jobs_claimed_as_the_database_comes_back_keep_their_whole_lease(
    aqueue: leaseq.AsyncQueue, database_url: str, schema: str
) -> None:
    """The database goes away (a restart, a failover) for longer than a lease
    while an idle worker's claim waits for a connection; then it comes back. The
    claim's leases start when it reaches the server, not when the worker began
    to wait: the jobs it takes must run under their lease, not be lost at once
    (their handlers stopped, an attempt spent, the jobs idle until the leases
    end)."""
    app = leaseq.App(schema=schema)
    ran: list[tuple[int, int]] = []

    @app.task("work", lease=3)
    async def work(job: leaseq.JobContext) -> None:
        await asyncio.sleep(0.2)
        ran.append((job.job_id, job.attempts))

    with frozen_proxy(database_url) as proxy:
        worker = leaseq.Worker(
            app,
            dsn=proxy.url,
            concurrency=2,
            poll_interval=0.1,
            listen=False,  # (no wake-up entry to check first: the claim itself waits)
            maintenance=False,
            metrics=None,
        )
        running = asyncio.create_task(worker.run())
        try:
            await _until(lambda: worker.stats.claim_statements > 0, "a first claim")
            proxy.go_down()
            claims = worker._claims
            assert claims is not None
            await _until(lambda: claims._claiming is not None, "a claim waiting")
            ids = await aqueue.enqueue_many("work", [{}, {}])
            await asyncio.sleep(4)  # longer than the lease: the claim still waits
            proxy.come_up()
            await _until(lambda: len(ran) == 2, "both jobs ran")
        finally:
            worker.request_stop()
            await asyncio.wait_for(running, 60)
    assert worker.stats.lost_leases == 0
    for job_id in ids:
        job = await aqueue.get(job_id)
        assert (job.status, job.attempts) == (leaseq.JobStatus.DONE, 1)


def _outage_lines(records: list[logging.LogRecord]) -> list[str]:
    """What was logged, at INFO or above, that is not about one job (a lost
    lease is said once per job, and should be)."""
    return [
        f"{r.name}: {r.getMessage()}"
        for r in records
        if r.levelno >= logging.INFO
        and r.name.startswith(("leaseq.worker", "psycopg"))
        and getattr(r, "job_id", None) is None
    ]


async def test_an_outage_is_said_once_and_its_end_once_not_once_per_retry(
    aqueue: leaseq.AsyncQueue, database_url: str, schema: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The database goes away for a while, jobs running: every service of the
    worker retries (claims, renewals, acknowledgements, LISTEN, the pools'
    connection attempts). An operator reading the log must see that the
    database went away and when it came back, not a line per retry of each."""
    app = leaseq.App(schema=schema)

    @app.task("work", lease=30)
    async def work(job: leaseq.JobContext) -> None:
        await asyncio.sleep(job.payload["seconds"])

    await aqueue.enqueue_many("work", [{"seconds": 0.05}] * 200 + [{"seconds": 3}] * 2)
    caplog.set_level(logging.INFO)
    with frozen_proxy(database_url) as proxy:
        worker = leaseq.Worker(
            app, dsn=proxy.url, concurrency=4, poll_interval=0.2, maintenance=False, metrics=None
        )
        running = asyncio.create_task(worker.run())
        try:
            await _until(lambda: worker.stats.completed > 20, "jobs done")
            caplog.clear()
            proxy.go_down()
            await asyncio.sleep(12)
            during = _outage_lines(caplog.records)
            caplog.clear()
            proxy.come_up()
            await _until(lambda: worker.stats.completed >= 202, "every job done", timeout=60)
            after = _outage_lines(caplog.records)
        finally:
            worker.request_stop()
            await asyncio.wait_for(running, 60)
    assert any("unreachable" in line for line in during), during
    assert len(during) <= 3, during
    assert any("reachable again" in line for line in after), after


async def test_a_stop_with_the_database_silent_does_not_blame_handlers_waiting_on_it(
    aqueue: leaseq.AsyncQueue,
    database_url: str,
    schema: str,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An async handler is inside its job.atransaction(), waiting on a query,
    when the database stops answering and the worker is stopped. Cancelled, it
    stops, but psycopg first asks the silent server to cancel the query (5 s),
    then waits for it (5 s more). The worker took it for a handler that swallows
    its cancellation and said so (an ERROR sending the operator to the code);
    its job must be given back or left to its lease, and the log must not blame
    the handler."""
    app = leaseq.App(schema=schema)
    querying = asyncio.Event()

    @app.task("work", lease=60)
    async def work(job: leaseq.JobContext) -> None:
        async with job.atransaction() as conn:
            querying.set()
            await conn.execute("SELECT pg_sleep(20)")

    await aqueue.enqueue("work", {})
    monkeypatch.setattr(runner, "ACKNOWLEDGEMENT_WAIT", 2.0)  # (the release is not answered)
    caplog.set_level(logging.INFO)
    with frozen_proxy(database_url) as proxy:
        worker = leaseq.Worker(
            app,
            dsn=proxy.url,
            concurrency=1,
            poll_interval=0.1,
            shutdown_grace=0.5,
            maintenance=False,
            metrics=None,
        )
        running = asyncio.create_task(worker.run())
        await asyncio.wait_for(querying.wait(), 30)
        await asyncio.sleep(0.2)  # the query is on its way
        proxy.frozen.set()
        worker.request_stop()
        await asyncio.wait_for(running, 60)
    assert "did not stop when cancelled" not in caplog.text


async def test_a_renewal_stuck_on_a_dead_connection_is_sent_again_on_a_new_one(
    aqueue: leaseq.AsyncQueue, database_url: str, schema: str
) -> None:
    """The worker's connections go silent (a NAT or load balancer failover drops
    the flows it knew, without a reset), while new connections reach the
    database. The renewal in flight waits on its dead connection until the
    kernel gives up (the TCP user timeout, 30 s): every running job's lease
    passed meanwhile, their handlers stopped, with the database there all along.
    A renewal that does not answer in time must be sent again on a new
    connection."""
    app = leaseq.App(schema=schema)
    started = threading.Event()
    over = threading.Event()
    told: list[int] = []

    @app.task("work", lease=3)
    def work(job: leaseq.JobContext) -> None:
        started.set()
        while not over.is_set():
            if job.lost.wait(0.05):
                told.append(job.job_id)
                return

    job_id = await aqueue.enqueue("work", {})
    with frozen_proxy(database_url) as proxy:
        worker = leaseq.Worker(
            app,
            dsn=proxy.url,
            concurrency=1,
            listen=False,
            shutdown_grace=1,
            maintenance=False,
            metrics=None,
        )
        running = asyncio.create_task(worker.run())
        try:
            await asyncio.wait_for(asyncio.to_thread(started.wait, 30), 35)
            claimed = (await aqueue.get(job_id)).lease_until
            deadline = time.monotonic() + 30
            while (await aqueue.get(job_id)).lease_until == claimed:  # the renewals' session
                assert time.monotonic() < deadline, "no renewal"
                await asyncio.sleep(0.05)
            proxy.hold_open_connections()
            await asyncio.sleep(6)  # two leases
        finally:
            over.set()
            worker.request_stop()
            await asyncio.wait_for(running, 60)
    assert told == []
