"""The workloads, written once against a small System interface, so that every
queue runs exactly the same producer, preload, drain and stop logic; the adapters
only say how their system enqueues, works and stores its pending jobs.

    <adapter> case '<json: {"case": ..., "dsn": ..., "workdir": ..., ...}>'
    <adapter> worker '<json>'   (started by the cases themselves)
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Protocol

import psycopg
from common import Workers, drain_summary, emit, write_ledger

PRELOAD_CHUNK = 1000
POLL = 0.1  # s between "anything pending?" probes of the driver's own connection


class System(Protocol):
    """What an adapter provides. `schema` holds every table of the system, so that
    dropping it resets the system and vacuuming its tables covers all of them."""

    name: str
    schema: str
    pending_sql: str  # one column: the sequence numbers of jobs not finished

    async def reset(self, dsn: str) -> None: ...
    async def open(self, dsn: str) -> None: ...
    async def close(self) -> None: ...
    async def enqueue_one(self, seq: int) -> None: ...
    async def enqueue_bulk(self, seqs: list[int]) -> None: ...


async def pending(dsn: str, system: System) -> list[int]:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        rows = await (await conn.execute(system.pending_sql)).fetchall()
    return [int(r[0]) for r in rows]


async def anything_pending(conn: psycopg.AsyncConnection[Any], system: System) -> bool:
    cur = await conn.execute(f"SELECT EXISTS ({system.pending_sql})")
    row = await cur.fetchone()
    return bool(row and row[0])


async def settle(dsn: str, system: System) -> None:
    """VACUUM ANALYZE the system's tables, then CHECKPOINT: autovacuum is off on the
    bench server, and every drain should start from the same clean state rather
    than from whatever the preload left (dead rows, no statistics, dirty buffers)."""
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        cur = await conn.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = %s", (system.schema,)
        )
        for (table,) in await cur.fetchall():
            await conn.execute(f'VACUUM ANALYZE "{system.schema}"."{table}"')
        await conn.execute("CHECKPOINT")


async def preload(dsn: str, system: System, first: int, count: int) -> None:
    await system.open(dsn)
    try:
        for lo in range(first, first + count, PRELOAD_CHUNK):
            await system.enqueue_bulk(list(range(lo, min(lo + PRELOAD_CHUNK, first + count))))
    finally:
        await system.close()


async def case_enqueue(p: dict[str, Any], system: System) -> dict[str, Any]:
    """W1: one job per transaction from one producer, or `batch` jobs per call."""
    dsn, jobs, batch = p["dsn"], p["jobs"], p.get("batch", 1)
    await system.reset(dsn)
    await system.open(dsn)
    try:
        started = time.perf_counter()
        if batch == 1:
            for seq in range(jobs):
                await system.enqueue_one(seq)
        else:
            for lo in range(0, jobs, batch):
                await system.enqueue_bulk(list(range(lo, min(lo + batch, jobs))))
        elapsed = time.perf_counter() - started
    finally:
        await system.close()
    write_ledger(Path(p["workdir"]), produced=range(jobs), pending_after=await pending(dsn, system))
    return {"jobs": jobs, "seconds": elapsed, "rate": jobs / elapsed}


async def run_workers(
    p: dict[str, Any], system: System, workers: Workers, **options: Any
) -> dict[str, Any]:
    """Start the worker processes, wait until nothing is pending (or until they stop
    by themselves after `stop_after` jobs), stop them, summarise what they saw."""
    dsn = p["dsn"]
    workers.start(
        p.get("processes", 1),
        gate=True,
        dsn=dsn,
        schema=system.schema,
        concurrency=p["concurrency"],
        **options,
    )
    try:
        await workers.open_gate()
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            deadline = time.monotonic() + p.get("timeout", 600)
            while workers.alive() and await anything_pending(conn, system):
                if time.monotonic() > deadline:
                    raise SystemExit(f"{system.name}: jobs still pending after the timeout")
                await asyncio.sleep(POLL)
    finally:
        workers.stop()
    return drain_summary(workers.records())


async def case_drain(p: dict[str, Any], system: System, script: str) -> dict[str, Any]:
    """W2: drain `jobs` pre-loaded jobs with `processes` x `concurrency`."""
    dsn, jobs = p["dsn"], p["jobs"]
    await system.reset(dsn)
    await preload(dsn, system, 0, jobs)
    await settle(dsn, system)
    workers = Workers(script, Path(p["workdir"]))
    # Only leaseq's steps carry these (its opt-in, measured beside its default; its
    # statements alone, measured beside its Worker).
    knobs = {k: p[k] for k in ("durable_acknowledgements", "statements_only") if k in p}
    result = await run_workers(p, system, workers, **knobs)
    write_ledger(
        Path(p["workdir"]), pending_before=range(jobs), pending_after=await pending(dsn, system)
    )
    return result


async def case_backlog_load(p: dict[str, Any], system: System) -> dict[str, Any]:
    """W4's setup: reset and pre-load `jobs` (not timed, nothing checked yet)."""
    started = time.perf_counter()
    await system.reset(p["dsn"])
    await preload(p["dsn"], system, 0, p["jobs"])
    loaded = await pending(p["dsn"], system)
    write_ledger(Path(p["workdir"]), produced=range(p["jobs"]), pending_after=loaded)
    return {"jobs": p["jobs"], "seconds": time.perf_counter() - started}


async def case_backlog_window(p: dict[str, Any], system: System, script: str) -> dict[str, Any]:
    """W4: drain `window` jobs from the standing backlog; the rest stays queued for
    the next repetition. The ledger covers the window: every job pending before it
    ran exactly once or is still pending."""
    dsn = p["dsn"]
    before = await pending(dsn, system)
    await settle(dsn, system)
    workers = Workers(script, Path(p["workdir"]))
    result = await run_workers(p, system, workers, stop_after=p["window"])
    write_ledger(
        Path(p["workdir"]), pending_before=before, pending_after=await pending(dsn, system)
    )
    return {**result, "backlog": len(before)}


async def paced_producer(
    system: System,
    rate: float,
    jobs: int,
    first: int,
    *,
    producers: int = 1,
    seconds: float | None = None,
    batch: int = 1,
) -> list[float]:
    """Jobs at a fixed rate (job i due at i / rate), one per transaction, or
    `batch` per enqueue call; from `producers` concurrent producers when one
    connection's commits cannot keep up; returns, per job, the wall time right
    after its enqueue returned (its commit acknowledged). With `seconds`,
    producing stops then even if the producers fell behind: a job never
    enqueued keeps 0.0."""
    committed = [0.0] * jobs
    origin = time.monotonic()
    end = origin + seconds if seconds is not None else float("inf")
    calls = range(0, jobs, batch)  # the first job of each call

    async def produce(offset: int) -> None:
        for start in calls[offset::producers]:
            delay = origin + start / rate - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            if time.monotonic() > end:
                return
            seqs = list(range(first + start, first + min(jobs, start + batch)))
            if batch == 1:
                await system.enqueue_one(seqs[0])
            else:
                await system.enqueue_bulk(seqs)
            now = time.time()
            for index in range(start, start + len(seqs)):
                committed[index] = now

    await asyncio.gather(*(produce(k) for k in range(producers)))
    return committed


def start_latencies(record: dict[str, Any], committed: list[float], first: int) -> dict[str, float]:
    """Handler start minus commit, per job, in ms: p50, p95, p99 and max."""
    start_of = dict(zip(record["seqs"], record["starts"], strict=True))
    ms = sorted(1000 * (start_of[first + i] - t) for i, t in enumerate(committed) if t)
    at = {q: ms[min(len(ms) - 1, int(q / 100 * len(ms)))] for q in (50, 95, 99)}
    return {"p50_ms": at[50], "p95_ms": at[95], "p99_ms": at[99], "max_ms": ms[-1]}


async def case_latency(p: dict[str, Any], system: System, script: str) -> dict[str, Any]:
    """W3: a producer at `rate` jobs/s for `seconds`, one worker at `concurrency`,
    each system's own wake-up (LISTEN/NOTIFY where it has one, its default poll)."""
    dsn, rate, jobs = p["dsn"], p["rate"], int(p["rate"] * p["seconds"])
    await system.reset(dsn)
    workdir = Path(p["workdir"])
    workers = Workers(script, workdir)
    # `notify`: the raw floor's worker listens (the peers' workers do by their defaults).
    workers.start(
        1, dsn=dsn, schema=system.schema, concurrency=p["concurrency"], notify=p.get("notify")
    )
    await system.open(dsn)
    try:
        # Job 0 is the warm-up: once it ran, the worker is up and listening.
        await system.enqueue_one(0)
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            while workers.alive() and await anything_pending(conn, system):
                await asyncio.sleep(0.05)
            started = time.perf_counter()
            committed = await paced_producer(system, rate, jobs, first=1)
            produced_for = time.perf_counter() - started
            while workers.alive() and await anything_pending(conn, system):
                await asyncio.sleep(POLL)
    finally:
        await system.close()
        workers.stop()
    (record,) = workers.records()
    write_ledger(workdir, produced=range(jobs + 1), pending_after=await pending(dsn, system))
    return {
        "jobs": jobs,
        "offered_rate": rate,
        "achieved_rate": jobs / produced_for,
        **start_latencies(record, committed, first=1),
    }


async def case_producers(p: dict[str, Any], system: System, script: str) -> dict[str, Any]:
    """One job per transaction from `producers` concurrent producers (the cost of
    NOTIFY: PostgreSQL serialises the commits of notifying transactions). No
    worker runs; `waiting`: one waits for work (leaseq then notifies)."""
    dsn, jobs, producers = p["dsn"], p["jobs"], p["producers"]
    await system.reset(dsn)
    if p.get("waiting"):  # leaseq notifies only while a worker waits (migration 0020)
        await system.a_worker_waits(dsn)
    await system.open(dsn)

    async def produce(offset: int) -> None:
        for seq in range(offset, jobs, producers):
            await system.enqueue_one(seq)

    try:
        started = time.perf_counter()
        await asyncio.gather(*(produce(k) for k in range(producers)))
        elapsed = time.perf_counter() - started
    finally:
        await system.close()
    write_ledger(Path(p["workdir"]), produced=range(jobs), pending_after=await pending(dsn, system))
    return {"jobs": jobs, "seconds": elapsed, "rate": jobs / elapsed}


Case = Callable[[dict[str, Any], Any, str], Awaitable[dict[str, Any]]]

CASES: dict[str, Case] = {
    "enqueue": lambda p, system, _: case_enqueue(p, system),
    "producers": case_producers,
    "drain": case_drain,
    "backlog_load": lambda p, system, _: case_backlog_load(p, system),
    "backlog_window": case_backlog_window,
    "latency": case_latency,
}


def case_main(
    p: dict[str, Any], system: System, script: str, extra: dict[str, Case] | None = None
) -> None:
    """Run the case `p` names on `system` and print its JSON result."""
    case = {**CASES, **(extra or {})}[p["case"]]
    result = asyncio.run(case(p, system, script))
    emit({"system": system.name, "case": p["case"], **result})
