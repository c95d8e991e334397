"""CPU-bound handlers: executor="thread" against executor="process".

Four CPU-bound jobs (a pure-Python loop, about a second each alone) at once on
one worker at concurrency 4: in threads they share the GIL and take turns; in
child processes they share the machine's cores. One worker per executor, warmed
up first (its children started), rounds alternating; wall time from the
enqueue's commit to the last result.

    .venv/bin/python bench/processes.py [--jobs 4] [--steps 6000000] [--rounds 3]
        [--database-url URL]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time

import psycopg

import leaseq

SCHEMA = "bench_processes"


def spin(job: leaseq.JobContext) -> int:
    """CPU-bound: holds the GIL for the whole loop."""
    total = 0
    for i in range(int(job.payload["steps"])):
        total += i * i % 7
    return total


async def timed_rounds(url: str, executor: str, jobs: int, steps: int, rounds: int) -> list[float]:
    app = leaseq.App(schema=SCHEMA)
    app.task("cpu", executor=executor)(spin)
    async with leaseq.AsyncQueue(url, schema=SCHEMA) as queue:
        worker = leaseq.Worker(app, dsn=url, concurrency=jobs, maintenance=False, metrics=None)
        running = asyncio.create_task(worker.run())

        async def one_round(steps: int) -> float:
            started = time.perf_counter()
            ids = await queue.enqueue_many("cpu", [{"steps": steps}] * jobs)
            for job_id in ids:
                await queue.wait_result(job_id, timeout=600)
            return time.perf_counter() - started

        await one_round(10_000)  # warm-up: the children start here
        times = [await one_round(steps) for _ in range(rounds)]
        worker.request_stop()
        await running
    return times


def reset(url: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{SCHEMA}" CASCADE')


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--database-url", default=None)
    parser.add_argument("--jobs", type=int, default=4)
    parser.add_argument("--steps", type=int, default=6_000_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    url = leaseq.database_url(args.database_url)
    reset(url)
    leaseq.Queue(url, schema=SCHEMA).migrate()
    times: dict[str, list[float]] = {"thread": [], "process": []}
    for round_ in range(args.rounds):
        order = ["thread", "process"] if round_ % 2 == 0 else ["process", "thread"]
        for executor in order:
            times[executor] += asyncio.run(
                timed_rounds(url, executor, args.jobs, args.steps, rounds=1)
            )
    reset(url)
    print(
        f"{args.jobs} CPU-bound jobs of {args.steps:,} steps at once, one worker at "
        f"concurrency {args.jobs}, {os.cpu_count()} cores, {args.rounds} rounds"
    )
    thread = statistics.median(times["thread"])
    for executor, values in times.items():
        median = statistics.median(values)
        print(
            f"executor={executor:<8} {median:6.2f} s (min {min(values):.2f}, max {max(values):.2f})"
            f"   speed-up over threads {thread / median:4.2f}x"
        )


if __name__ == "__main__":
    main()
