"""The limits behind the targets leaseq misses: what PostgreSQL does with leaseq's
own job table, measured beside leaseq in the same run.

* Bulk enqueue: enqueue_many of 1,000 jobs against COPY of the same 1,000 rows
  (the columns an enqueue writes) into leaseq's job table, and COPY into the
  minimal table of `make bench`'s raw ceiling.
* Lifecycle: the batched claim/complete loop, 100 jobs per statement, on
  leaseq's table with leaseq's own claim statement and a bare completion (no
  fence, no worker), against the same loop on the minimal table; both on a
  session with the worker's own settings (one generic plan per statement).
* Concurrency 50 without the worker: leaseq's own claim (50 jobs) and fenced
  ``complete_many`` through the async client, on two connections with the
  worker's own session settings, the next
  claim sent while the last 50 are being completed (what the worker does, with
  no handler, task, lease, outcome or metric per job), beside the Worker at
  concurrency 50 on the same load: the most leaseq's statements allow there.
* Start latency: a durable commit of a one-row UPDATE, p50/p95/p99; no claim
  starts a job sooner than its own commit comes back.
* One enqueue per transaction, taken apart: the minimal INSERT, leaseq's own
  enqueue statement sent on a bare connection (what the statement costs), and
  `Queue.enqueue` (what the library adds: validation, the pool, the span).

Alternating rounds, medians: the machine is shared and noisy.

    .venv/bin/python bench/ceilings.py [--database-url URL] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import psycopg
from psycopg.types.json import Jsonb

import leaseq
from leaseq._async_client import SERVICE_CONNECTIONS

sys.path.insert(0, str(Path(__file__).parent / "systems"))
# bench/systems is not a package (its scripts run on their own): its raw ceiling
import raw_sys

SCHEMA = "bench_ceilings"
# The minimal table, its claim and its completion: `make bench`'s raw ceiling's own.
MINIMAL_SCHEMA = "bench_ceilings_raw"
MINIMAL_DDL = raw_sys.DDL.format(schema=MINIMAL_SCHEMA)
MINIMAL_CLAIM = raw_sys.CLAIM.format(schema=MINIMAL_SCHEMA)
MINIMAL_COMPLETE = raw_sys.COMPLETE.format(schema=MINIMAL_SCHEMA)
PAYLOADS = [{"n": n} for n in range(1000)]
BATCHES = 20  # bulk calls per measurement
LIFECYCLE_JOBS = 50_000
# The settings of the worker's own sessions (claims, acknowledgements): one generic
# plan per prepared statement. Without them the server re-plans leaseq's claim on
# every call (~0.7 ms of a 50-job claim's ~2 ms), which no worker pays: the
# loops below measured 18,700 jobs/s at concurrency 50 against 22,700 with them.
WORKER_SESSION = SERVICE_CONNECTIONS
BATCH = 100


def timed(action: Callable[..., int], *args: object) -> float:
    """Rows per second of one call of ``action(*args)`` (which returns its row count)."""
    started = time.perf_counter()
    rows = action(*args)
    return rows / (time.perf_counter() - started)


def bulk_enqueue(queue: leaseq.Queue) -> int:
    for _ in range(BATCHES):
        queue.enqueue_many("bench", PAYLOADS)
    return BATCHES * len(PAYLOADS)


def copy_rows(conn: psycopg.Connection[object], sql: str, row: Callable[[str], tuple]) -> int:
    texts = [json.dumps(p, separators=(",", ":")) for p in PAYLOADS]
    for _ in range(BATCHES):
        with conn.transaction(), conn.cursor().copy(sql) as copy:
            for text in texts:
                copy.write_row(row(text))
    return BATCHES * len(PAYLOADS)


def copy_into_job_table(conn: psycopg.Connection[object]) -> int:
    sql = (
        f"COPY {SCHEMA}.job (queue, payload, payload_bytes, available_at, max_attempts) FROM STDIN"
    )
    now = conn.execute("SELECT now()").fetchone()[0]  # type: ignore[index]
    return copy_rows(conn, sql, lambda text: ("bench", text, len(text), now, 20))


def copy_into_minimal(conn: psycopg.Connection[object]) -> int:
    sql = f"COPY {MINIMAL_SCHEMA}.job (queue, payload) FROM STDIN"
    return copy_rows(conn, sql, lambda text: ("bench", text))


def lifecycle_on_job_table(queue: leaseq.Queue, conn: psycopg.Connection[object]) -> int:
    claim = queue._store.claim("bench", limit=BATCH).statements[0]
    done = 0
    while rows := conn.execute(claim.sql, claim.params).fetchall():
        conn.execute(
            f"UPDATE {SCHEMA}.job SET status = 'done', lease_until = NULL,"
            " finished_at = now() WHERE job_id = ANY(%s)",
            ([r[0] for r in rows],),
        )
        done += len(rows)
    return done


def lifecycle_on_minimal(conn: psycopg.Connection[object]) -> int:
    done = 0
    while rows := conn.execute(MINIMAL_CLAIM, ("bench", BATCH)).fetchall():
        conn.execute(MINIMAL_COMPLETE, ([r[0] for r in rows],))
        done += len(rows)
    return done


ONE_BY_ONE = 2000  # enqueues per measurement of each form
PIPELINED_JOBS = 20_000
PIPELINED_BATCH = 50


async def pipelined_without_worker(url: str) -> int:
    """Claims of 50 on one client, their completion on another, overlapped; both
    with the worker's own session settings (one generic plan per statement)."""
    claimer = leaseq.AsyncQueue(url, schema=SCHEMA, pool_size=1, connection_options=WORKER_SESSION)
    acker = leaseq.AsyncQueue(url, schema=SCHEMA, pool_size=1, connection_options=WORKER_SESSION)
    async with claimer, acker:
        await acker.stats()  # both pools open before the clock starts
        started, done = time.perf_counter(), 0
        claims = await claimer.claim("bench", limit=PIPELINED_BATCH)
        while claims:
            completing = asyncio.create_task(acker.complete_many(claims))
            done += len(claims)
            claims = await claimer.claim("bench", limit=PIPELINED_BATCH)
            await completing
        return int(done / (time.perf_counter() - started))


async def worker_at_50(url: str) -> int:
    app = leaseq.App(schema=SCHEMA)
    finished = asyncio.Event()
    done = 0

    @app.task("bench")
    async def noop(job: leaseq.JobContext) -> None:
        nonlocal done
        done += 1
        if done == PIPELINED_JOBS:
            finished.set()

    worker = leaseq.Worker(app, dsn=url, concurrency=PIPELINED_BATCH, maintenance=False)
    started = time.perf_counter()
    running = asyncio.create_task(worker.run())
    await finished.wait()
    elapsed = time.perf_counter() - started
    worker.request_stop()
    await running
    return int(done / elapsed)


def load_for_pipelines(queue: leaseq.Queue, conn: psycopg.Connection[object]) -> None:
    conn.execute(f"DELETE FROM {SCHEMA}.job")
    for start in range(0, PIPELINED_JOBS, 10_000):
        queue.enqueue_many("bench", [{"n": n} for n in range(start, start + 10_000)])
    vacuum(conn)
    conn.execute("CHECKPOINT")


def insert_minimal(conn: psycopg.Connection[object]) -> int:
    sql = f"INSERT INTO {MINIMAL_SCHEMA}.job (queue, payload) VALUES (%s, %s)"
    for n in range(ONE_BY_ONE):
        conn.execute(sql, ("bench", Jsonb({"n": n})))
    return ONE_BY_ONE


def enqueue_statement_bare(queue: leaseq.Queue, conn: psycopg.Connection[object]) -> int:
    for n in range(ONE_BY_ONE):
        (statement,) = queue._store.enqueue("bench", {"n": n}).statements
        conn.execute(statement.sql, statement.params)
    return ONE_BY_ONE


def enqueue_one_by_one(queue: leaseq.Queue) -> int:
    for n in range(ONE_BY_ONE):
        queue.enqueue("bench", {"n": n})
    return ONE_BY_ONE


def commit_latencies(conn: psycopg.Connection[object], count: int = 3000) -> list[float]:
    conn.execute(f"CREATE TABLE IF NOT EXISTS {SCHEMA}.one (id int PRIMARY KEY, v int)")
    conn.execute(f"INSERT INTO {SCHEMA}.one VALUES (1, 0) ON CONFLICT DO NOTHING")
    latencies = []
    for _ in range(count):
        started = time.perf_counter()
        conn.execute(f"UPDATE {SCHEMA}.one SET v = v + 1 WHERE id = 1")
        latencies.append((time.perf_counter() - started) * 1000)
    return sorted(latencies)


def reset(url: str) -> leaseq.Queue:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"DROP SCHEMA IF EXISTS {SCHEMA} CASCADE")
        conn.execute(f"DROP SCHEMA IF EXISTS {MINIMAL_SCHEMA} CASCADE")
    queue = leaseq.Queue(url, schema=SCHEMA)
    queue.migrate()
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(MINIMAL_DDL)
    return queue


def vacuum(conn: psycopg.Connection[object]) -> None:
    conn.execute(f"VACUUM ANALYZE {SCHEMA}.job")
    conn.execute(f"VACUUM ANALYZE {MINIMAL_SCHEMA}.job")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--database-url", default=None)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    url = leaseq.database_url(args.database_url)
    results: dict[str, list[float]] = {}

    def record(name: str, value: float) -> None:
        results.setdefault(name, []).append(value)

    for _ in range(args.rounds):
        queue = reset(url)
        with psycopg.connect(url, autocommit=True) as conn:
            record("enqueue_many, 1,000 per call", timed(bulk_enqueue, queue))
            record("COPY into leaseq's job table", timed(copy_into_job_table, conn))
            record("COPY into the minimal table", timed(copy_into_minimal, conn))
        queue.close()
        queue = reset(url)
        with psycopg.connect(url, autocommit=True) as conn:
            queue.enqueue("bench", {"n": -1})  # the queue's settings row exists
            for _ in range(2):  # each form twice, alternating
                record(
                    "one per transaction: INSERT into the minimal table",
                    timed(insert_minimal, conn),
                )
                record(
                    "one per transaction: leaseq's statement, bare connection",
                    timed(enqueue_statement_bare, queue, conn),
                )
                record("one per transaction: Queue.enqueue", timed(enqueue_one_by_one, queue))
        queue.close()
        queue = reset(url)
        with psycopg.connect(url, autocommit=True) as conn:
            for start in range(0, LIFECYCLE_JOBS, 10_000):
                queue.enqueue_many("bench", [{"n": n} for n in range(start, start + 10_000)])
            conn.execute(
                f"INSERT INTO {MINIMAL_SCHEMA}.job (queue, payload) SELECT 'bench',"
                f" jsonb_build_object('n', n) FROM generate_series(1, {LIFECYCLE_JOBS}) AS n"
            )
            vacuum(conn)
            with psycopg.connect(url, **WORKER_SESSION) as session:  # both loops alike
                record(
                    "lifecycle, 100 per statement, leaseq's table and claim",
                    timed(lifecycle_on_job_table, queue, session),
                )
                record(
                    "lifecycle, 100 per statement, minimal table",
                    timed(lifecycle_on_minimal, session),
                )
            for _ in range(2):  # each form twice, alternating
                load_for_pipelines(queue, conn)
                record(
                    "concurrency 50: Worker (jobs/s)",
                    asyncio.run(worker_at_50(url)),
                )
                load_for_pipelines(queue, conn)
                record(
                    "concurrency 50: claim + complete_many, pipelined, no worker",
                    asyncio.run(pipelined_without_worker(url)),
                )
            latencies = commit_latencies(conn)
            for share in (0.5, 0.95, 0.99):
                record(
                    f"durable one-row commit, p{share * 100:g} (ms)",
                    latencies[int(share * len(latencies))],
                )
        queue.close()
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"DROP SCHEMA IF EXISTS {SCHEMA} CASCADE")
        conn.execute(f"DROP SCHEMA IF EXISTS {MINIMAL_SCHEMA} CASCADE")
    width = max(len(name) for name in results)
    print(f"{'measurement':<{width}}  median (min-max) over {args.rounds} rounds")
    for name, values in results.items():
        digits = 2 if "(ms)" in name else 0
        low, mid, high = min(values), statistics.median(values), max(values)
        print(f"{name:<{width}}  {mid:,.{digits}f} ({low:,.{digits}f}-{high:,.{digits}f})")


if __name__ == "__main__":
    main()
