"""Claim rate over a long drain with autovacuum off: with and without the leader's vacuum.

Both runs drain the same number of jobs from a job table whose autovacuum is off
(``autovacuum_enabled = false``, as when the server runs with ``autovacuum = off``),
claiming in small batches as workers do and completing each batch. One run has a
maintenance leader beside it (which vacuums the job table once its dead rows
pass 1000 + 1% of its rows); the other has none. Printed: the claim rate per
window of the drain, the dead rows and the table's size at its end, and the ratio of the two runs.

    .venv/bin/python bench/vacuum.py [--jobs 200000] [--batch 20] [--database-url URL]
"""

from __future__ import annotations

import argparse
import asyncio
import threading
import time

import psycopg

import leaseq

SCHEMA = "bench_vacuum"


def _fresh(url: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{SCHEMA}" CASCADE')
    with leaseq.Queue(url, schema=SCHEMA) as queue:
        queue.migrate()
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f'ALTER TABLE "{SCHEMA}".job SET (autovacuum_enabled = false)')


def _leader(url: str, stop: threading.Event, vacuums: list[int]) -> None:
    async def lead() -> None:
        async with leaseq.AsyncQueue(url, schema=SCHEMA) as queue:
            maintenance = leaseq.Maintenance(queue, interval=1.0)
            task = asyncio.create_task(maintenance.run())
            while not stop.is_set():
                await asyncio.sleep(0.1)
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            vacuums.append(maintenance.vacuums)

    asyncio.run(lead())


def drain(url: str, jobs: int, batch: int, *, leader: bool) -> float:
    _fresh(url)
    stop = threading.Event()
    vacuums: list[int] = []
    thread = threading.Thread(target=_leader, args=(url, stop, vacuums), daemon=True)
    with leaseq.Queue(url, schema=SCHEMA) as queue:
        for start in range(0, jobs, 10_000):
            queue.enqueue_many("bench", [{"n": n} for n in range(start, start + 10_000)])
        if leader:
            thread.start()
        window = jobs // 5
        done = 0
        started = mark = time.perf_counter()
        rates = []
        while claims := queue.claim("bench", limit=batch):
            queue.complete_many(claims)
            done += len(claims)
            if done % window < batch:
                now = time.perf_counter()
                rates.append(window / (now - mark))
                mark = now
        elapsed = time.perf_counter() - started
        stop.set()
        if leader:
            thread.join(30)
        dead = queue.health().table("job")
        assert dead is not None
    label = "with the leader's vacuum" if leader else "without vacuum"
    print(
        f"{label:26s} {jobs / elapsed:8.0f} jobs/s; per window: "
        + " ".join(f"{r:.0f}" for r in rates)
        + f"; dead rows at the end ~{dead.dead_tuples:,}, table + indexes "
        + f"{dead.total_bytes / 2**20:.0f} MiB"
        + (f"; {vacuums[0]} vacuums" if vacuums else "")
    )
    return jobs / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=200_000)
    parser.add_argument("--batch", type=int, default=20)
    parser.add_argument("--database-url", default=None)
    args = parser.parse_args()
    url = leaseq.database_url(args.database_url)
    without = drain(url, args.jobs, args.batch, leader=False)
    with_leader = drain(url, args.jobs, args.batch, leader=True)
    print(f"ratio with / without the leader's vacuum: {with_leader / without:.2f}")
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{SCHEMA}" CASCADE')


if __name__ == "__main__":
    main()
