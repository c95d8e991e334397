"""A worker's stop, bounded as the README says: the running jobs' grace runs
from the stop even while a claim is in flight, and no thread of an async
handler's blocking call keeps a stopped `leaseq worker` alive."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
import time

import psycopg
import pytest

import leaseq
from leaseq import JobStatus

from .conftest import ROOT

pytestmark = pytest.mark.asyncio


# -- a claim in flight at the stop must not double the running jobs' grace --------------

GRACE = 1.5


# Its claim waits on a lock, its snapshot held for seconds: never beside the tests
# that read plans after VACUUM (see test_plans).
@pytest.mark.xdist_group("cleanup_horizon")
async def test_a_claim_in_flight_at_the_stop_does_not_make_running_jobs_wait_a_second_grace(
    queue: leaseq.Queue, database_url: str
) -> None:
    """The claim in flight at the stop got the grace, and only then did the
    running jobs' grace start: a job was told to stop (and given back) after
    twice the grace. With the database away at a stop (a claim stuck until the
    grace ends), the README's "under 30 s in all" with --shutdown-grace 10 was
    35 s, and with the default grace of 30 s the supervisor's SIGKILL (grace +
    30 s) came before the releases."""
    schema = queue.schema
    queue.configure_queue("work", max_running=10)  # its claims lock its claim_turn row
    app = leaseq.App(schema=schema)
    started = threading.Event()
    told: dict[str, float] = {}

    @app.task("work")
    def handler(job: leaseq.JobContext) -> None:
        started.set()
        job.lost.wait(30)
        told["at"] = time.monotonic()

    job_id = queue.enqueue("work", {})
    worker = leaseq.Worker(
        app,
        dsn=database_url,
        concurrency=2,
        poll_interval=0.1,
        listen=False,
        maintenance=False,
        shutdown_grace=GRACE,
    )
    running = asyncio.create_task(worker.run())
    assert await asyncio.to_thread(started.wait, 15)
    locker = psycopg.connect(database_url)
    try:
        # A lock the claim waits on (a migration's, say); the renewals never take it.
        locker.execute(f'LOCK TABLE "{schema}".claim_turn IN ACCESS EXCLUSIVE MODE')
        deadline = time.monotonic() + 10
        while True:  # the next poll's claim waits on the lock now
            row = locker.execute(
                "SELECT count(*) FROM pg_locks WHERE NOT granted AND relation = %s::regclass",
                (f'"{schema}".claim_turn',),
            ).fetchone()
            if row and row[0] > 0:
                break
            assert time.monotonic() < deadline, "the worker's claim never waited on the lock"
            await asyncio.sleep(0.05)
        stopped_at = time.monotonic()
        worker.request_stop()
        while "at" not in told and time.monotonic() - stopped_at < 15:
            await asyncio.sleep(0.05)
    finally:
        locker.rollback()
        locker.close()
    await asyncio.wait_for(running, 30)
    assert "at" in told
    # Told at the end of its grace (not of the claim's grace plus its own).
    assert told["at"] - stopped_at < GRACE + 0.9, told["at"] - stopped_at
    job = queue.get(job_id)
    assert (job.status, job.attempts) == (JobStatus.QUEUED, 0), job.history


# Its claim would wait on a lock, its snapshot held: as the test above.
@pytest.mark.xdist_group("cleanup_horizon")
async def test_a_stop_during_the_schema_check_sends_no_claim_after_it(
    queue: leaseq.Queue, database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The stop cancels the statement in flight after the grace; but when that was
    the check before a claim (the schema's migrations, a queue's wake-up fence),
    the loop went on to send the claim, after the stop, and nothing cancelled it:
    waiting on a lock (a deploy's migration), the stop hung until the lock went."""
    schema = queue.schema
    app = leaseq.App(schema=schema)

    @app.task("work")
    async def handler(job: leaseq.JobContext) -> None:
        pass

    queue.enqueue("work", {})
    worker = leaseq.Worker(
        app,
        dsn=database_url,
        poll_interval=0.1,
        listen=False,
        maintenance=False,
        metrics=None,
        shutdown_grace=0.5,
    )
    checking = leaseq.AsyncQueue._require_migrated

    async def stopped_while_checking(client: leaseq.AsyncQueue) -> None:
        worker.request_stop()  # a SIGTERM while the check is in flight
        await checking(client)

    monkeypatch.setattr(leaseq.AsyncQueue, "_require_migrated", stopped_while_checking)
    locker = psycopg.connect(database_url)
    try:
        # What a claim would wait on (a migration's lock, say).
        locker.execute(f'LOCK TABLE "{schema}".job IN ACCESS EXCLUSIVE MODE')
        running = asyncio.create_task(worker.run())
        done, _ = await asyncio.wait({running}, timeout=10)
        assert done, "the stop hung on a claim sent after it"
    finally:
        locker.rollback()
        locker.close()
    await running
    assert worker.stats.claim_statements == 0


# -- a handler's asyncio.to_thread call cannot keep a stopped `leaseq worker` alive ------

#: The app `leaseq worker tests.test_worker_stops:app` runs (its schema from
#: LEASEQ_SCHEMA), for the test below.
app = leaseq.App(schema=os.environ.get("LEASEQ_SCHEMA", "leaseq"))


@app.task("blocking")
async def blocking(job: leaseq.JobContext) -> None:
    """The usual way to call blocking code from an async handler; the call
    (a request without a timeout, say) takes longer than any grace."""
    await asyncio.to_thread(time.sleep, job.payload["sleep"])


@pytest.mark.server_agnostic
async def test_a_blocking_call_of_an_async_handler_cannot_keep_a_stopped_worker_alive(
    queue: leaseq.Queue, database_url: str
) -> None:
    """At the stop the handler was cancelled and its job given back, but the
    thread of its asyncio.to_thread call ran on, and `leaseq worker` waited for
    it before exiting (the event loop's default executor is joined at its
    shutdown, and at the interpreter's exit): as long as the call lasted, for
    ever for a hung one, past any --shutdown-grace and beside the job's next
    run elsewhere. The README: a handler cannot keep a stopped worker alive."""
    job_id = queue.enqueue("blocking", {"sleep": 40})
    worker = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "leaseq",
            "worker",
            "tests.test_worker_stops:app",
            "--schema",
            queue.schema,
            "--poll-interval",
            "0.2",
            "--shutdown-grace",
            "1",
            "--no-listen",
            "--no-maintenance",
        ],
        cwd=ROOT,
        env={**os.environ, "DATABASE_URL": database_url, "LEASEQ_SCHEMA": queue.schema},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 30
        while queue.get(job_id).status is not JobStatus.RUNNING:
            assert time.monotonic() < deadline, "the job never started"
            assert worker.poll() is None, "the worker ended"
            await asyncio.sleep(0.1)
        await asyncio.sleep(0.3)  # in its to_thread call now
        stopped_at = time.monotonic()
        worker.send_signal(signal.SIGTERM)
        try:
            code = await asyncio.to_thread(worker.wait, 20)
        except subprocess.TimeoutExpired:
            pytest.fail("the stopped worker did not exit while the handler's thread ran")
        took = time.monotonic() - stopped_at
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait(10)
    assert code == 0
    assert took < 15, took
    job = queue.get(job_id)
    assert (job.status, job.attempts) == (JobStatus.QUEUED, 0), job.history  # given back
