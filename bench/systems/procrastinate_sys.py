"""procrastinate 3.10 under the shared workloads (run with bench/.venvs/procrastinate).

Knobs (why in bench/README.md): PsycopgConnector (its async connector) with a
pool of concurrency + 2 connections; run_worker_async(concurrency=N,
listen_notify=True, fetch_job_polling_interval=5.0 (the default),
delete_jobs="successful", install_signal_handlers=False); enqueue with
defer_async, bulk with batch_defer_async.

    bench/.venvs/procrastinate/bin/python bench/systems/procrastinate_sys.py case '<json>'
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
from typing import Any

import procrastinate
import psycopg
from cases import case_main
from common import Recorder, with_search_path, worker_main

SCHEMA = "bench_procrastinate"
QUEUE = "bench"


def make_app(dsn: str, schema: str, pool_size: int) -> procrastinate.App:
    # min_size = max_size: every connection is open before the first job, so that a
    # drain never waits for the pool to grow (leaseq and pgqueuer connect up front too).
    connector = procrastinate.PsycopgConnector(
        conninfo=with_search_path(dsn, schema), min_size=pool_size, max_size=pool_size
    )
    return procrastinate.App(connector=connector)


class Procrastinate:
    name = "procrastinate"

    def __init__(self, schema: str = SCHEMA, pool_size: int = 10) -> None:
        self.schema = schema
        self.pending_sql = (
            f"SELECT (args->>'n')::bigint FROM {schema}.procrastinate_jobs"
            " WHERE status IN ('todo', 'doing')"
        )
        self.pool_size = pool_size
        self.app: procrastinate.App | None = None
        self.task: Any = None

    async def reset(self, dsn: str) -> None:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            await conn.execute(f"DROP SCHEMA IF EXISTS {self.schema} CASCADE")
            await conn.execute(f"CREATE SCHEMA {self.schema}")
        app = make_app(dsn, self.schema, 2)
        async with app.open_async():
            await app.schema_manager.apply_schema_async()

    async def open(self, dsn: str) -> None:
        self.app = make_app(dsn, self.schema, self.pool_size)

        @self.app.task(name="bench", queue=QUEUE)
        async def bench(n: int) -> None:  # only deferred from here, never run
            return None

        self.task = bench
        await self.app.open_async()

    async def close(self) -> None:
        if self.app is not None:
            await self.app.close_async()

    async def enqueue_one(self, seq: int) -> None:
        await self.task.defer_async(n=seq)

    async def enqueue_bulk(self, seqs: list[int]) -> None:
        await self.task.batch_defer_async(*({"n": seq} for seq in seqs))


async def work(options: dict[str, Any], recorder: Recorder) -> None:
    concurrency = options["concurrency"]
    app = make_app(options["dsn"], options["schema"], concurrency + 2)

    @app.task(name="bench", queue=QUEUE)
    async def bench(n: int) -> None:
        await recorder.admit()
        recorder.started(n)
        recorder.finished()

    async with app.open_async():
        worker = asyncio.create_task(
            app.run_worker_async(
                queues=[QUEUE],
                concurrency=concurrency,
                listen_notify=True,
                delete_jobs="successful",
                install_signal_handlers=False,
            )
        )
        await recorder.stop.wait()
        # Cancelling run_worker_async is procrastinate's graceful stop: it stops
        # fetching and waits for the running jobs.
        worker.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await worker


def main() -> None:
    if sys.argv[1] == "worker":
        worker_main(work)
        return
    p = json.loads(sys.argv[2])
    system = Procrastinate(p.get("schema", SCHEMA), pool_size=max(10, p.get("producers", 1)))
    case_main(p, system, __file__)


if __name__ == "__main__":
    main()
