"""Drain rate of the leaseq worker against a raw psycopg claim/complete loop.

Both drain the same number of no-op jobs from the same kind of table; the raw
loop is the batched ceiling (claim N, complete N, nothing else), so the ratio
says what leases, renewals, bookkeeping and the asyncio runtime cost.

    .venv/bin/python bench/worker.py [--jobs 20000] [--concurrency 50] [--database-url URL]
"""

from __future__ import annotations

import argparse
import asyncio
import time

import psycopg

import leaseq

SCHEMA = "bench_worker"


async def drain_with_worker(url: str, jobs: int, concurrency: int) -> float:
    app = leaseq.App(schema=SCHEMA)

    @app.task("bench")
    async def handler(job: leaseq.JobContext) -> None:
        return None

    async with leaseq.AsyncQueue(url, schema=SCHEMA) as queue:
        await queue.enqueue_many("bench", [{"n": n} for n in range(jobs)])
        worker = leaseq.Worker(app, dsn=url, concurrency=concurrency, maintenance=False)
        started = time.perf_counter()
        task = asyncio.create_task(worker.run())
        while True:
            (stats,) = await queue.stats("bench")
            # Queued and running are exact; the done count of a table past 8 MiB
            # is an estimate (QueueStats.estimated), which once ended drains early.
            if not stats.counts[leaseq.JobStatus.QUEUED] + stats.counts[leaseq.JobStatus.RUNNING]:
                break
            await asyncio.sleep(0.05)
        elapsed = time.perf_counter() - started
        worker.request_stop()
        await task
    stats = worker.stats
    print(
        f"worker: {stats.claim_statements} claim statements "
        f"({stats.claimed / max(stats.claim_statements, 1):.1f} jobs each), "
        f"{stats.claim_seconds:.2f}s claiming"
    )
    return jobs / elapsed


def drain_raw(url: str, jobs: int, batch: int) -> float:
    queue = leaseq.Queue(url, schema=SCHEMA)
    queue.enqueue_many("raw", [{"n": n} for n in range(jobs)])
    claim = queue._store.claim("raw", limit=batch).statements[0]
    with psycopg.connect(url, autocommit=True) as conn:
        started = time.perf_counter()
        done = 0
        while rows := conn.execute(claim.sql, claim.params).fetchall():
            conn.execute(
                f"UPDATE \"{SCHEMA}\".job SET status = 'done', lease_until = NULL,"
                " finished_at = now() WHERE job_id = ANY(%s)",
                ([r[0] for r in rows],),
            )
            done += len(rows)
        elapsed = time.perf_counter() - started
    queue.close()
    return done / elapsed


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--concurrency", type=int, default=50)
    parser.add_argument("--database-url", default=None)
    args = parser.parse_args()
    url = leaseq.database_url(args.database_url)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"DROP SCHEMA IF EXISTS {SCHEMA} CASCADE")
    leaseq.Queue(url, schema=SCHEMA).migrate()
    raw = drain_raw(url, args.jobs, args.concurrency)
    ours = asyncio.run(drain_with_worker(url, args.jobs, args.concurrency))
    print(f"{'drain':<40} {'jobs/s':>10}")
    print(f"{'raw claim+complete loop, batch ' + str(args.concurrency):<40} {raw:>10.0f}")
    print(f"{'leaseq Worker, concurrency ' + str(args.concurrency):<40} {ours:>10.0f}")
    print(f"ratio leaseq/raw: {ours / raw:.2f}")
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"DROP SCHEMA IF EXISTS {SCHEMA} CASCADE")


if __name__ == "__main__":
    main()
