"""What a queue's limits and groups cost a drain: one worker draining no-op jobs
from a plain queue, against the same drain through claim_limited() (a
concurrency limit it never reaches; jobs spread over groups; both), alternating
rounds in one run, ratios against the plain queue. Then what an idle claim costs
when many groups are full (at their ``rate_limit_per_group``, or running their
``max_running_per_group``): each has a job queued that it may not start yet, and
the claim starts nothing.

    .venv/bin/python bench/limits.py [--jobs 20000] [--concurrency 50] [--rounds 3]
        [--full-groups 2000] [--only SETUP ...] [--database-url URL]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from typing import Any

import psycopg

import leaseq

SCHEMA = "bench_limits"

#: name -> (queue settings, groups the jobs are spread over; 0: ungrouped)
SETUPS: dict[str, tuple[dict[str, Any], int]] = {
    "plain": ({}, 0),
    "max_running (never reached)": ({"max_running": 100_000}, 0),
    "10 groups, no limit (fair share)": ({}, 10),
    "1,000 groups, no limit (fair share)": ({}, 1000),
    "10 groups, max_running_per_group=100": ({"max_running_per_group": 100}, 10),
    "100 groups, a group rate never reached": ({"rate_limit_per_group": (1_000_000, 60)}, 100),
    "100 groups, max_running_per_group=1000": ({"max_running_per_group": 1000}, 100),
}


async def drain(
    url: str, jobs: int, concurrency: int, settings: dict[str, Any], groups: int
) -> float:
    app = leaseq.App(schema=SCHEMA)

    @app.task("bench")
    async def handler(job: leaseq.JobContext) -> None:
        return None

    async with leaseq.AsyncQueue(url, schema=SCHEMA) as queue:
        await queue.migrate()
        await queue.configure_queue("bench", **settings)
        if groups:
            per_group = jobs // groups
            for g in range(groups):
                await queue.enqueue_many(
                    "bench", [{"n": n} for n in range(per_group)], group=f"g{g}"
                )
        else:
            await queue.enqueue_many("bench", [{"n": n} for n in range(jobs)])
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(f'VACUUM ANALYZE "{SCHEMA}".job')
        worker = leaseq.Worker(
            app, dsn=url, concurrency=concurrency, maintenance=False, metrics=None
        )
        started = time.perf_counter()
        task = asyncio.create_task(worker.run())
        while True:
            (stats,) = await queue.stats("bench")
            if stats.queued == 0 and stats.running == 0:
                break
            await asyncio.sleep(0.02)
        elapsed = time.perf_counter() - started
        worker.request_stop()
        await task
    return worker.stats.completed / elapsed


#: name -> the queue's settings under which each group started its one job and
#: has another queued that may not start yet
FULL_GROUPS: dict[str, dict[str, Any]] = {
    "at their rate": {"rate_limit_per_group": (1, 3600)},
    "each running its one job": {"max_running_per_group": 1},
}


def idle_claims(url: str, groups: int, settings: dict[str, Any], claims: int = 15) -> list[float]:
    """Seconds per claim that starts nothing: ``groups`` groups are full under
    ``settings``, and each has a job queued."""
    with leaseq.Queue(url, schema=SCHEMA) as queue:
        queue.migrate()
        queue.configure_queue("bench", **settings)
        for g in range(groups):
            queue.enqueue_many("bench", [{"n": 0}, {"n": 1}], group=f"tenant-{g:06d}")
        while started := queue.claim("bench", limit=500, lease=3600):
            if "rate_limit_per_group" in settings:
                queue.complete_many(started)
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(f'VACUUM ANALYZE "{SCHEMA}".job')
        seconds = []
        for _ in range(claims):
            began = time.perf_counter()
            assert not queue.claim("bench", limit=50)
            seconds.append(time.perf_counter() - began)
    return seconds


def reset(url: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{SCHEMA}" CASCADE')


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--database-url", default=None)
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--concurrency", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--full-groups", type=int, default=2000)
    parser.add_argument("--only", nargs="*", choices=list(SETUPS), default=list(SETUPS))
    args = parser.parse_args()
    url = leaseq.database_url(args.database_url)
    rates: dict[str, list[float]] = {name: [] for name in ["plain", *args.only]}
    for round_ in range(args.rounds):
        names = list(rates)
        names = names[round_ % len(names) :] + names[: round_ % len(names)]  # interleaved
        for name in names:
            reset(url)
            settings, groups = SETUPS[name]
            rates[name].append(
                asyncio.run(drain(url, args.jobs, args.concurrency, settings, groups))
            )
    reset(url)
    plain = statistics.median(rates["plain"])
    print(
        f"{args.jobs} no-op jobs, one worker at concurrency {args.concurrency},"
        f" {args.rounds} rounds"
    )
    print(f"{'setup':<40} {'jobs/s (median, min-max)':>28} {'÷ plain':>8}")
    for name, values in rates.items():
        median = statistics.median(values)
        spread = f"{median:,.0f} ({min(values):,.0f}-{max(values):,.0f})"
        print(f"{name:<40} {spread:>28} {median / plain:>8.2f}")
    for what, settings in FULL_GROUPS.items() if args.full_groups else ():
        reset(url)
        seconds = idle_claims(url, args.full_groups, settings)
        reset(url)
        print(
            f"a claim that starts nothing, {args.full_groups:,} groups {what}:"
            f" {statistics.median(seconds) * 1000:.1f} ms"
            f" (median of {len(seconds)}; {min(seconds) * 1000:.1f}-{max(seconds) * 1000:.1f})"
        )


if __name__ == "__main__":
    main()
