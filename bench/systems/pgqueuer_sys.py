"""pgqueuer 1.6 under the shared workloads (run with bench/.venvs/pgqueuer).

Knobs (why in bench/README.md): the asyncpg driver; QueueManager.run with
batch_size = concurrency // 2 and max_concurrent_tasks = concurrency (its hard
cap on picked jobs, which must be at least twice the batch), or, at concurrency
1, batch_size 1 and the entrypoint's concurrency_limit=1; dequeue_timeout 30 s
and the durable tables (the defaults); schema via Queries.install(). Enqueue
with Queries.enqueue, bulk with its list form.

    bench/.venvs/pgqueuer/bin/python bench/systems/pgqueuer_sys.py case '<json>'
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

import asyncpg
import pgqueuer
import psycopg
from cases import case_main
from common import Recorder, worker_main
from pgqueuer.models import Job

SCHEMA = "bench_pgqueuer"
ENTRYPOINT = "bench"


async def connect(dsn: str, schema: str) -> asyncpg.Connection:
    # Its objects are unqualified: the search path puts them in a schema of our own.
    return await asyncpg.connect(dsn, server_settings={"search_path": schema})


def payload(seq: int) -> bytes:
    return json.dumps({"n": seq}).encode()


class Pgqueuer:
    name = "pgqueuer"

    def __init__(self, schema: str = SCHEMA) -> None:
        self.schema = schema
        # Finished jobs leave the queue table (for its log table): what is in it is pending.
        self.pending_sql = (
            f"SELECT (convert_from(payload, 'UTF8')::jsonb->>'n')::bigint FROM {schema}.pgqueuer"
        )
        self.conn: asyncpg.Connection | None = None
        self.queries: pgqueuer.Queries | None = None

    async def reset(self, dsn: str) -> None:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            await conn.execute(f"DROP SCHEMA IF EXISTS {self.schema} CASCADE")
            await conn.execute(f"CREATE SCHEMA {self.schema}")
        conn = await connect(dsn, self.schema)
        try:
            await pgqueuer.Queries(pgqueuer.AsyncpgDriver(conn)).install()
        finally:
            await conn.close()

    async def open(self, dsn: str) -> None:
        self.conn = await connect(dsn, self.schema)
        self.queries = pgqueuer.Queries(pgqueuer.AsyncpgDriver(self.conn))

    async def close(self) -> None:
        if self.conn is not None:
            await self.conn.close()

    async def enqueue_one(self, seq: int) -> None:
        assert self.queries is not None
        await self.queries.enqueue(ENTRYPOINT, payload(seq))

    async def enqueue_bulk(self, seqs: list[int]) -> None:
        assert self.queries is not None
        await self.queries.enqueue(
            [ENTRYPOINT] * len(seqs), [payload(seq) for seq in seqs], [0] * len(seqs)
        )


async def work(options: dict[str, Any], recorder: Recorder) -> None:
    concurrency = options["concurrency"]
    conn = await connect(options["dsn"], options["schema"])
    qm = pgqueuer.QueueManager(pgqueuer.Queries(pgqueuer.AsyncpgDriver(conn)))

    @qm.entrypoint(ENTRYPOINT, concurrency_limit=1 if concurrency == 1 else 0)
    async def bench(job: Job) -> None:
        await recorder.admit()
        recorder.started(json.loads(job.payload or b"{}")["n"])
        recorder.finished()

    if concurrency == 1:
        knobs: dict[str, Any] = {"batch_size": 1}
    else:
        knobs = {"batch_size": concurrency // 2, "max_concurrent_tasks": concurrency}
    task = asyncio.create_task(qm.run(**knobs))
    await recorder.stop.wait()
    qm.shutdown.set()  # its graceful stop: running jobs finish, their logs flush
    await task
    await conn.close()


def main() -> None:
    if sys.argv[1] == "worker":
        worker_main(work)
        return
    p = json.loads(sys.argv[2])
    case_main(p, Pgqueuer(p.get("schema", SCHEMA)), __file__)


if __name__ == "__main__":
    main()
