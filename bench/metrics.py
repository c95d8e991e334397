"""What metrics cost the worker: a no-op drain with metrics on against the same drain off.

Rounds alternate in pairs, off/on then on/off (so neither side always runs second),
in one run, each on an emptied job table (done rows and dead tuples of the round
before would slow the next); the ratio of the best rate of each side is printed,
and the median of the per-pair ratios. "On" is what `leaseq worker
--metrics-port` runs: every instrument, the /metrics server, and a scraper process
fetching /metrics every second (the database gauges cached for 5 s).

    .venv/bin/python bench/metrics.py [--jobs 10000] [--rounds 3] [--concurrency 50]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import time

import psycopg

import leaseq

SCHEMA = "bench_metrics"


#: Process CPU seconds of each drain, by side (steadier than wall time on a shared box).
CPU: dict[str, list[float]] = {"off": [], "on": []}


async def drain(url: str, jobs: int, concurrency: int, metrics: leaseq.Metrics | None) -> float:
    app = leaseq.App(schema=SCHEMA)

    @app.task("bench")
    async def handler(job: leaseq.JobContext) -> None:
        return None

    async with leaseq.AsyncQueue(url, schema=SCHEMA, metrics=None) as queue:
        async with queue.connection() as conn:
            await conn.execute(f"TRUNCATE {SCHEMA}.job")
            await conn.execute(f"VACUUM ANALYZE {SCHEMA}.job")
        await queue.enqueue_many("bench", [{"n": n} for n in range(jobs)])
    worker = leaseq.Worker(
        app, dsn=url, concurrency=concurrency, maintenance=False, metrics=metrics
    )
    started, cpu = time.perf_counter(), time.process_time()
    task = asyncio.create_task(worker.run())
    while worker.stats.completed < jobs:
        await asyncio.sleep(0.01)
    elapsed = time.perf_counter() - started
    CPU["off" if metrics is None else "on"].append((time.process_time() - cpu) / jobs)
    worker.request_stop()
    await task
    return jobs / elapsed


class Scraper:
    """Fetches /metrics every second while a drain with metrics runs, from a process
    of its own as Prometheus would: the worker process pays for serving, not for
    the scraper's HTTP client."""

    SCRIPT = (
        "import sys, time, urllib.request\n"
        "n = 0\n"
        "while True:\n"
        "    time.sleep(1.0)\n"
        "    urllib.request.urlopen(sys.argv[1], timeout=10).read()\n"
        "    n += 1\n"
        "    print(n, flush=True)\n"
    )

    def __init__(self, port: int) -> None:
        self.scrapes = 0
        self._process = subprocess.Popen(
            [sys.executable, "-c", self.SCRIPT, f"http://127.0.0.1:{port}/metrics"],
            stdout=subprocess.PIPE,
            text=True,
        )

    def stop(self) -> None:
        self._process.terminate()
        output, _ = self._process.communicate(timeout=15)
        self.scrapes = len(output.split())


def with_metrics(url: str, jobs: int, concurrency: int) -> tuple[float, int]:
    metrics = leaseq.Metrics()
    watcher = leaseq.Queue(url, schema=SCHEMA, pool_size=1, metrics=None)
    metrics.watch(watcher)
    server = metrics.serve(0)
    scraper = Scraper(server.port)
    try:
        rate = asyncio.run(drain(url, jobs, concurrency, metrics))
    finally:
        scraper.stop()
        server.close()
        watcher.close()
    return rate, scraper.scrapes


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=50)
    parser.add_argument("--database-url", default=None)
    args = parser.parse_args()
    url = leaseq.database_url(args.database_url)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"DROP SCHEMA IF EXISTS {SCHEMA} CASCADE")
    leaseq.Queue(url, schema=SCHEMA, metrics=None).migrate()
    asyncio.run(drain(url, min(args.jobs, 2000), args.concurrency, None))  # warm up
    CPU["off"].clear()
    off: list[float] = []
    on: list[float] = []
    scrapes = 0
    for round_ in range(args.rounds):
        for side in ("off", "on") if round_ % 2 == 0 else ("on", "off"):
            if side == "off":
                off.append(asyncio.run(drain(url, args.jobs, args.concurrency, None)))
            else:
                rate, scraped = with_metrics(url, args.jobs, args.concurrency)
                on.append(rate)
                scrapes += scraped
    print(f"{'drain of ' + str(args.jobs) + ' no-op jobs':<36} {'jobs/s per round':>30}")
    print(f"{'metrics off':<36} {' '.join(f'{r:7.0f}' for r in off):>30}")
    print(f"{'metrics on (served, scraped 1/s)':<36} {' '.join(f'{r:7.0f}' for r in on):>30}")
    print(f"scrapes during the 'on' rounds: {scrapes}")
    print(f"ratio on/off, best of each: {max(on) / max(off):.3f}")
    pairs = [a / b for a, b in zip(on, off, strict=True)]
    print(f"ratio on/off, median of pairs: {statistics.median(pairs):.3f}")
    cpu_off, cpu_on = statistics.median(CPU["off"]), statistics.median(CPU["on"])
    print(
        f"worker process CPU per job (median): off {cpu_off * 1e6:.0f} us, "
        f"on {cpu_on * 1e6:.0f} us; ratio off/on {cpu_off / cpu_on:.3f}"
    )
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"DROP SCHEMA IF EXISTS {SCHEMA} CASCADE")


if __name__ == "__main__":
    main()
