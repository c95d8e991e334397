"""W5, the soak: a steady producer at a fraction of the drain capacity for minutes,
one worker with retention and the maintenance leader on; what grows?

The worker's RSS (VmRSS from /proc) and the system's tables + indexes
(pg_total_relation_size) are sampled throughout; growth is reported from the end
of the warm-up, when caches, pools and the retention horizon have filled.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path
from typing import Any

import psycopg
from cases import System, anything_pending, paced_producer, pending, start_latencies
from common import Workers, rss_kib, write_ledger

SIZE_SQL = (
    "SELECT coalesce(sum(pg_total_relation_size(format('%%I.%%I', schemaname, tablename)"
    "::regclass)), 0) FROM pg_tables WHERE schemaname = %s"
)


async def sample(
    dsn: str, system: System, pid: int, every: float, until: asyncio.Event
) -> list[dict[str, float]]:
    samples: list[dict[str, float]] = []
    origin = time.monotonic()
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        while not until.is_set():
            row = await (await conn.execute(SIZE_SQL, (system.schema,))).fetchone()
            samples.append(
                {
                    "t": time.monotonic() - origin,
                    "rss_kib": float(rss_kib(pid) or 0),
                    "bytes": float(row[0] if row else 0),
                }
            )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(until.wait(), every)
    return samples


def growth(samples: list[dict[str, float]], warmup: float) -> dict[str, float]:
    after = [s for s in samples if s["t"] >= warmup] or samples[-1:]
    first, last = after[0], samples[-1]
    minutes = max((last["t"] - first["t"]) / 60, 1e-9)
    return {
        "rss_mib_at_warmup": first["rss_kib"] / 1024,
        "rss_mib_end": last["rss_kib"] / 1024,
        "rss_growth_mib_per_min": (last["rss_kib"] - first["rss_kib"]) / 1024 / minutes,
        "size_mib_at_warmup": first["bytes"] / 2**20,
        "size_mib_end": last["bytes"] / 2**20,
        "size_growth_mib_per_min": (last["bytes"] - first["bytes"]) / 2**20 / minutes,
    }


async def case_soak(p: dict[str, Any], system: Any, script: str) -> dict[str, Any]:
    dsn, rate, seconds = p["dsn"], p["rate"], p["seconds"]
    jobs = int(rate * seconds)
    await system.reset(dsn)
    await system.configure_retention(dsn, p["retain_done"])
    workdir = Path(p["workdir"])
    workers = Workers(script, workdir)
    workers.start(
        1,
        dsn=dsn,
        schema=system.schema,
        concurrency=p["concurrency"],
        maintenance=True,
        capacity=jobs + 1,  # a preallocated record: the RSS measured is the worker's own
    )
    await system.open(dsn)
    done = asyncio.Event()
    try:
        await system.enqueue_one(0)  # the warm-up job: the worker is up once it ran
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            while workers.alive() and await anything_pending(conn, system):
                await asyncio.sleep(0.05)
            sampler = asyncio.create_task(
                sample(dsn, system, workers.procs[0].pid, p["sample_every"], done)
            )
            started = time.perf_counter()
            # Four producers, ten jobs per enqueue: one job per transaction tops
            # out near 1,600 jobs/s beside a draining worker, below half a drain.
            # Time-bound: a soak lasts its seconds even if the producers fall behind.
            committed = await paced_producer(
                system, rate, jobs, first=1, producers=4, seconds=seconds, batch=10
            )
            produced_for = time.perf_counter() - started
            done.set()
            samples = await sampler
            while workers.alive() and await anything_pending(conn, system):
                await asyncio.sleep(0.1)
    finally:
        done.set()
        await system.close()
        workers.stop()
    (record,) = workers.records()
    produced = [0] + [1 + i for i, t in enumerate(committed) if t]
    write_ledger(workdir, produced=produced, pending_after=await pending(dsn, system))
    return {
        "jobs": len(produced) - 1,
        "seconds": produced_for,
        "offered_rate": rate,
        "achieved_rate": (len(produced) - 1) / produced_for,
        "cpu_us_per_job": 1e6 * record["cpu_s"] / max(len(record["seqs"]), 1),
        **start_latencies(record, committed, first=1),
        "warmup_s": p["warmup"],
        **growth(samples, p["warmup"]),
        "samples": samples,
    }
