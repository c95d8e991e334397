"""leaseq under the shared workloads, through its public API only.

Knobs (why in bench/README.md): Worker(concurrency=N, maintenance=False) with the
defaults otherwise (LISTEN on, poll 1 s, metrics on, as a user gets them);
AsyncQueue(pool_size=10, notify=True) for producers. The soak turns retention
and the maintenance leader on. The *_async_acks drains run the opt-in
Worker(durable_acknowledgements=False), beside the default. The *_statements
drains run no Worker: leaseq's claim and fenced complete_many back to back (the
most its statements allow at that batch size), on the Worker's own session
settings, the one thing here taken from leaseq's internals.

    .venv/bin/python bench/systems/leaseq_sys.py case '<json>'
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

import psycopg
from cases import case_main
from common import Recorder, worker_main
from soak import case_soak

import leaseq
from leaseq._async_client import SERVICE_CONNECTIONS

SCHEMA = "bench_leaseq"
QUEUE = "bench"


class Leaseq:
    name = "leaseq"

    def __init__(self, schema: str = SCHEMA, notify: bool = True, pool_size: int = 10) -> None:
        self.schema = schema
        self.pending_sql = (
            f"SELECT (payload->>'n')::bigint FROM {schema}.job"
            " WHERE status IN ('queued', 'running')"
        )
        self.notify = notify
        self.pool_size = pool_size
        self.queue: leaseq.AsyncQueue | None = None

    async def reset(self, dsn: str) -> None:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            await conn.execute(f"DROP SCHEMA IF EXISTS {self.schema} CASCADE")
        async with leaseq.AsyncQueue(dsn, schema=self.schema) as queue:
            await queue.migrate()

    async def open(self, dsn: str) -> None:
        self.queue = leaseq.AsyncQueue(
            dsn, schema=self.schema, notify=self.notify, pool_size=self.pool_size
        )
        # Its pool opens on first use: opened here, before the clock starts, as
        # the other systems connect in their open().
        async with self.queue.connection():
            pass

    async def close(self) -> None:
        if self.queue is not None:
            await self.queue.close()

    async def enqueue_one(self, seq: int) -> None:
        assert self.queue is not None
        await self.queue.enqueue(QUEUE, {"n": seq})

    async def enqueue_bulk(self, seqs: list[int]) -> None:
        assert self.queue is not None
        await self.queue.enqueue_many(QUEUE, [{"n": seq} for seq in seqs])

    async def a_worker_waits(self, dsn: str) -> None:
        """The entry an idle worker of the queue makes (migration 0020): from now on
        its enqueues notify, as they do whenever some worker waits for work."""
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            await conn.execute(
                f"INSERT INTO {self.schema}.queue (name, waiting) VALUES "
                "(%s, jsonb_build_object('bench: an idle worker', 1e10))",
                (QUEUE,),
            )

    async def configure_retention(self, dsn: str, retain_done: float) -> None:
        async with leaseq.AsyncQueue(dsn, schema=self.schema) as queue:
            await queue.configure_queue(QUEUE, retain_done=retain_done)


async def work(options: dict[str, Any], recorder: Recorder) -> None:
    if options.get("statements_only"):
        await statements_only(options, recorder)
        return
    app = leaseq.App(schema=options["schema"])

    @app.task(QUEUE)
    async def handle(job: leaseq.JobContext) -> None:
        await recorder.admit()
        recorder.started(job.payload["n"])
        recorder.finished()

    worker = leaseq.Worker(
        app,
        dsn=options["dsn"],
        concurrency=options["concurrency"],
        maintenance=options.get("maintenance", False),
        durable_acknowledgements=options.get("durable_acknowledgements", True),
    )
    task = asyncio.create_task(worker.run())
    await recorder.stop.wait()
    worker.request_stop()
    await task


async def statements_only(options: dict[str, Any], recorder: Recorder) -> None:
    """Claims of `concurrency` jobs on one session, each batch completed (fenced,
    durable) on a second while the next claim runs: the Worker's own overlap, with
    no handler, task, lease renewal, outcome or metric per job. Both sessions carry
    the Worker's settings (one generic plan per statement), as its own do."""

    def client() -> leaseq.AsyncQueue:
        return leaseq.AsyncQueue(
            options["dsn"],
            schema=options["schema"],
            pool_size=1,
            connection_options=SERVICE_CONNECTIONS,
        )

    async def complete(claims: list[leaseq.Claim]) -> None:
        answers = await acker.complete_many(claims)
        if not all(accepted for _, accepted in answers):
            raise SystemExit("statements_only: a completion was refused (a lease lost)")
        recorder.finished()

    completing: asyncio.Task[None] | None = None
    async with client() as claimer, client() as acker:
        try:
            while not recorder.stop.is_set():
                claims = await claimer.claim(QUEUE, limit=options["concurrency"])
                if not claims:
                    await asyncio.sleep(0.01)
                    continue
                await recorder.admit()
                for claim in claims:
                    recorder.started(claim.payload["n"])
                if completing is not None:
                    await completing
                completing = asyncio.create_task(complete(claims))
        finally:
            if completing is not None:
                await completing


def main() -> None:
    if sys.argv[1] == "worker":
        worker_main(work)
        return
    p = json.loads(sys.argv[2])
    # The notify cases compare AsyncQueue(notify=True) with notify=False (and with
    # a worker waiting, when enqueues do notify); a pool as large as the
    # producers, so that none waits for a connection.
    system = Leaseq(
        p.get("schema", SCHEMA),
        notify=p.get("notify", True),
        pool_size=max(10, p.get("producers", 1)),
    )
    case_main(p, system, __file__, extra={"soak": case_soak})


if __name__ == "__main__":
    main()
