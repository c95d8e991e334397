"""Drain rate of keyed (ordered) jobs against the same number of plain jobs.

The same leaseq Worker drains, one after the other in the same run:

* ``plain``: N jobs without an ordering key;
* ``keyed``: N jobs spread over K ordering keys (N/K per key, in order);
* ``one key + plain``: N/4 jobs of one key enqueued first, then N plain jobs
  behind them in the same queue (the plain jobs must not starve behind the
  key's backlog).

Each run is checked: every job done, and every key's jobs finished in seq
order. Printed: jobs/s per drain, the keyed/plain ratio (the goal: keyed within
2x of plain) and the rate of the plain jobs behind one key's backlog against
plain jobs alone (the goal: no starvation).

    .venv/bin/python bench/ordering.py [--jobs 20000] [--keys 200] [--concurrency 20]
"""

from __future__ import annotations

import argparse
import asyncio
import time

import psycopg

import leaseq

SCHEMA = "bench_ordering"


async def plain_done(url: str, queue_name: str) -> int:
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        cursor = await conn.execute(
            f'SELECT count(*) FROM "{SCHEMA}".job WHERE queue = %s AND status = %s'
            " AND ordering_key IS NULL",
            (queue_name, "done"),
        )
        row = await cursor.fetchone()
    return int(row[0]) if row else 0


async def drain(
    url: str, queue_name: str, jobs: int, concurrency: int, plain: int = 0
) -> tuple[float, float]:
    """(jobs/s for all ``jobs``, jobs/s for the first ``plain`` unordered ones)."""
    app = leaseq.App(schema=SCHEMA)

    @app.task(queue_name)
    async def handler(job: leaseq.JobContext) -> None:
        return None

    async with leaseq.AsyncQueue(url, schema=SCHEMA) as queue:
        worker = leaseq.Worker(app, dsn=url, concurrency=concurrency, maintenance=False)
        started = time.perf_counter()
        plain_elapsed = 0.0
        task = asyncio.create_task(worker.run())
        while True:
            (stats,) = await queue.stats(queue_name)
            if plain and not plain_elapsed and await plain_done(url, queue_name) >= plain:
                plain_elapsed = time.perf_counter() - started
            # Queued and running are exact; the done count of a table past 8 MiB
            # is an estimate (QueueStats.estimated), which once ended drains early.
            if not stats.counts[leaseq.JobStatus.QUEUED] + stats.counts[leaseq.JobStatus.RUNNING]:
                break
            await asyncio.sleep(0.05)
        elapsed = time.perf_counter() - started
        worker.request_stop()
        await task
    return jobs / elapsed, plain / (plain_elapsed or elapsed)


def check_order(url: str, queue_name: str) -> None:
    """Every key's jobs finished in (seq, id) order."""
    with psycopg.connect(url) as conn:
        bad = conn.execute(
            f"""SELECT count(*) FROM (
                SELECT finished_at < lag(finished_at) OVER w AS out_of_order
                FROM "{SCHEMA}".job WHERE queue = %s AND ordering_key IS NOT NULL
                WINDOW w AS (PARTITION BY ordering_key ORDER BY ordering_seq, job_id)) AS o
            WHERE out_of_order""",
            (queue_name,),
        ).fetchone()
    assert bad == (0,), f"{queue_name}: {bad} jobs finished before their predecessor"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--keys", type=int, default=200)
    parser.add_argument("--concurrency", type=int, default=20)
    parser.add_argument("--database-url", default=None)
    args = parser.parse_args()
    url = leaseq.database_url(args.database_url)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"DROP SCHEMA IF EXISTS {SCHEMA} CASCADE")
    with leaseq.Queue(url, schema=SCHEMA) as queue:
        queue.migrate()
        queue.enqueue_many("plain", [{"n": n} for n in range(args.jobs)])
        per_key = args.jobs // args.keys
        for k in range(args.keys):
            queue.enqueue_many("keyed", [{"n": n} for n in range(per_key)], key=f"k{k}")
        queue.enqueue_many("mixed", [{"n": n} for n in range(args.jobs // 4)], key="one")
        queue.enqueue_many("mixed", [{"n": n} for n in range(args.jobs)])
    plain, _ = asyncio.run(drain(url, "plain", args.jobs, args.concurrency))
    keyed, _ = asyncio.run(drain(url, "keyed", per_key * args.keys, args.concurrency))
    mixed, behind = asyncio.run(
        drain(url, "mixed", args.jobs + args.jobs // 4, args.concurrency, plain=args.jobs)
    )
    rates = {
        "plain": plain,
        f"keyed ({args.keys} keys)": keyed,
        "one key, then plain behind it: all": mixed,
        "one key, then plain behind it: plain": behind,
    }
    check_order(url, "keyed")
    check_order(url, "mixed")
    print(f"{'drain (concurrency ' + str(args.concurrency) + ')':<40} {'jobs/s':>10}")
    for name, rate in rates.items():
        print(f"{name:<40} {rate:>10.0f}")
    print(f"ratio keyed/plain: {keyed / plain:.2f}")
    print(f"ratio plain behind one key's backlog / plain alone: {behind / plain:.2f}")
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"DROP SCHEMA IF EXISTS {SCHEMA} CASCADE")


if __name__ == "__main__":
    main()
