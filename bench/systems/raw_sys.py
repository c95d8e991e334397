"""The raw psycopg ceilings, run from the leaseq .venv: the least SQL a queue can do.

A minimal job table of the reference shape (id bigserial, queue, payload jsonb,
status, run_at, a partial index on ready jobs). Enqueue: a committed single-row
INSERT per transaction, with or without pg_notify in it; bulk: COPY. Lifecycle:
claim = UPDATE ... WHERE id IN (SELECT ... FOR UPDATE SKIP LOCKED LIMIT n)
RETURNING, complete = UPDATE ... WHERE id = ANY(...), `concurrency` jobs per
statement, in one or more processes. Finished rows are kept (status 'done'),
as leaseq keeps them until retention. Start latency (W3's floor): the same loop
woken by LISTEN on a connection of its own, the producer's INSERT notifying in
its transaction; a job "starts" when its claim's commit comes back.

    .venv/bin/python bench/systems/raw_sys.py case '<json>'
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
from typing import Any

import psycopg
from cases import case_main
from common import Recorder, worker_main
from psycopg.types.json import Jsonb
from psycopg_pool import AsyncConnectionPool

SCHEMA = "bench_raw"
QUEUE = "bench"
DDL = """
CREATE SCHEMA {schema};
CREATE TABLE {schema}.job (
    id bigserial PRIMARY KEY,
    queue text NOT NULL,
    payload jsonb NOT NULL,
    status text NOT NULL DEFAULT 'queued',
    run_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX job_ready ON {schema}.job (queue, run_at, id) WHERE status = 'queued';
"""
# One statement in autocommit: the transaction and its commit in one round trip,
# the least a producer can do. The notifying form keeps the NOTIFY in the same
# transaction (a CTE), as a queue's enqueue does.
INSERT = "INSERT INTO {schema}.job (queue, payload) VALUES (%s, %s)"
INSERT_NOTIFY = (
    "WITH job AS (INSERT INTO {schema}.job (queue, payload) VALUES (%s, %s) RETURNING id)"
    " SELECT pg_notify('bench_raw', job.id::text) FROM job"
)
CLAIM = """
UPDATE {schema}.job SET status = 'running'
 WHERE id IN (SELECT id FROM {schema}.job
               WHERE queue = %s AND status = 'queued' AND run_at <= now()
               ORDER BY run_at, id FOR UPDATE SKIP LOCKED LIMIT %s)
RETURNING id, payload
"""
COMPLETE = "UPDATE {schema}.job SET status = 'done' WHERE id = ANY(%s)"


class Raw:
    name = "raw"

    def __init__(self, schema: str = SCHEMA, notify: bool = False, pool_size: int = 1) -> None:
        self.schema = schema
        self.pending_sql = (
            f"SELECT (payload->>'n')::bigint FROM {schema}.job"
            " WHERE status IN ('queued', 'running')"
        )
        self.insert = (INSERT_NOTIFY if notify else INSERT).format(schema=schema)
        self.notify = notify
        self.pool_size = pool_size
        self.pool: AsyncConnectionPool | None = None

    async def reset(self, dsn: str) -> None:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            await conn.execute(f"DROP SCHEMA IF EXISTS {self.schema} CASCADE")
            await conn.execute(DDL.format(schema=self.schema))

    async def open(self, dsn: str) -> None:
        # One connection per producer, opened before the clock starts; autocommit, so
        # that each statement is its own transaction (no BEGIN/COMMIT round trips).
        self.pool = AsyncConnectionPool(
            dsn,
            min_size=self.pool_size,
            max_size=self.pool_size,
            kwargs={"autocommit": True},
            open=False,
        )
        await self.pool.open(wait=True)

    async def close(self) -> None:
        if self.pool is not None:
            await self.pool.close()

    async def enqueue_one(self, seq: int) -> None:
        assert self.pool is not None
        async with self.pool.connection() as conn:
            await conn.execute(self.insert, (QUEUE, Jsonb({"n": seq})))

    async def enqueue_bulk(self, seqs: list[int]) -> None:
        assert self.pool is not None
        async with self.pool.connection() as conn:  # one COPY: one transaction
            cur = conn.cursor()
            async with cur.copy(f"COPY {self.schema}.job (queue, payload) FROM STDIN") as copy:
                for seq in seqs:
                    await copy.write_row((QUEUE, json.dumps({"n": seq})))


async def work(options: dict[str, Any], recorder: Recorder) -> None:
    """The batched claim/complete loop: claim `concurrency`, "run" them, complete
    them in one statement, until told to stop. With `notify`, an empty claim
    waits for a notification (or 1 s) instead of sleeping 10 ms."""
    batch, schema = options["concurrency"], options["schema"]
    claim, complete = CLAIM.format(schema=schema), COMPLETE.format(schema=schema)
    wake = asyncio.Event()
    async with await psycopg.AsyncConnection.connect(options["dsn"], autocommit=True) as conn:
        listener = (
            asyncio.create_task(listen(options["dsn"], wake)) if options.get("notify") else None
        )
        try:
            while not recorder.stop.is_set():
                wake.clear()  # a notification during the claim sets it again
                rows = await (await conn.execute(claim, (QUEUE, batch))).fetchall()
                if not rows:
                    if listener is None:
                        await asyncio.sleep(0.01)
                    else:
                        await wait_for(wake, 1.0)
                    continue
                await recorder.admit()
                for _, payload in rows:
                    recorder.started(payload["n"])
                await conn.execute(complete, ([job_id for job_id, _ in rows],))
                recorder.finished()
        finally:
            if listener is not None:
                listener.cancel()


async def listen(dsn: str, wake: asyncio.Event) -> None:
    """LISTEN on the producers' channel; each notification wakes the claim loop."""
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await conn.execute("LISTEN bench_raw")
        async for _ in conn.notifies():
            wake.set()


async def wait_for(event: asyncio.Event, timeout: float) -> None:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(event.wait(), timeout)


def main() -> None:
    if sys.argv[1] == "worker":
        worker_main(work)
        return
    p = json.loads(sys.argv[2])
    system = Raw(
        p.get("schema", SCHEMA), notify=p.get("notify", False), pool_size=p.get("producers", 1)
    )
    case_main(p, system, __file__)


if __name__ == "__main__":
    main()
