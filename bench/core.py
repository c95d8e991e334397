"""leaseq's core operations against raw psycopg doing the reference article's SQL.

Prints ratios (leaseq / raw) measured in the same run, because these machines
are shared and noisy: absolute numbers mean little, ratios a lot more.

    .venv/bin/python bench/core.py [--jobs 20000] [--database-url URL]
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable

import psycopg

import leaseq

RAW_SCHEMA = "bench_raw"
LEASEQ_SCHEMA = "bench_leaseq"

RAW_TABLE = f"""
CREATE TABLE {RAW_SCHEMA}.background_job (
    job_id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    payload jsonb NOT NULL,
    status text NOT NULL DEFAULT 'queued',
    available_at timestamptz NOT NULL DEFAULT now(),
    lease_until timestamptz,
    lease_version bigint NOT NULL DEFAULT 0,
    attempts integer NOT NULL DEFAULT 0,
    created_at timestamptz NOT NULL DEFAULT now(),
    finished_at timestamptz
);
CREATE INDEX ON {RAW_SCHEMA}.background_job (available_at, job_id) WHERE status = 'queued';
CREATE INDEX ON {RAW_SCHEMA}.background_job (lease_until, job_id) WHERE status = 'running';
"""

RAW_CLAIM = f"""
WITH candidate AS (
    SELECT job_id FROM {RAW_SCHEMA}.background_job
    WHERE (status = 'queued' AND available_at <= statement_timestamp())
       OR (status = 'running' AND lease_until <= statement_timestamp())
    ORDER BY available_at, job_id
    LIMIT %s
    FOR UPDATE SKIP LOCKED
)
UPDATE {RAW_SCHEMA}.background_job AS job
SET status = 'running', lease_until = statement_timestamp() + interval '60 seconds',
    lease_version = job.lease_version + 1, attempts = job.attempts + 1
FROM candidate WHERE job.job_id = candidate.job_id
RETURNING job.job_id, job.payload, job.lease_version, job.attempts
"""

RAW_COMPLETE = f"""
UPDATE {RAW_SCHEMA}.background_job
SET status = 'done', lease_until = NULL, finished_at = statement_timestamp()
FROM unnest(%s::bigint[], %s::bigint[]) AS c (job_id, lease_version)
WHERE background_job.job_id = c.job_id AND background_job.lease_version = c.lease_version
  AND status = 'running' AND lease_until > statement_timestamp()
RETURNING background_job.job_id
"""


def timed(action: Callable[[], int]) -> float:
    """Items per second."""
    started = time.perf_counter()
    count = action()
    return count / (time.perf_counter() - started)


def reset(url: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"DROP SCHEMA IF EXISTS {RAW_SCHEMA} CASCADE")
        conn.execute(f"DROP SCHEMA IF EXISTS {LEASEQ_SCHEMA} CASCADE")
        conn.execute(f"CREATE SCHEMA {RAW_SCHEMA}")
        conn.execute(RAW_TABLE)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--database-url", default=None)
    args = parser.parse_args()
    url = leaseq.database_url(args.database_url)
    reset(url)
    n = args.jobs
    payloads = [{"report_id": i, "customer": f"c{i % 50}"} for i in range(n)]
    single = min(n, 3000)
    rows: list[tuple[str, float, float]] = []

    with (
        leaseq.Queue(url, schema=LEASEQ_SCHEMA) as queue,
        psycopg.connect(url, autocommit=True) as raw,
    ):
        queue.migrate()
        insert = f"INSERT INTO {RAW_SCHEMA}.background_job (payload) VALUES (%s::jsonb)"

        def raw_single() -> int:
            for p in payloads[:single]:
                raw.execute(insert, (json.dumps(p),))
            return single

        def leaseq_single() -> int:
            for p in payloads[:single]:
                queue.enqueue("bench", p)
            return single

        rows.append(("enqueue one at a time", timed(leaseq_single), timed(raw_single)))

        def raw_bulk() -> int:
            raw.execute(
                f"INSERT INTO {RAW_SCHEMA}.background_job (payload)"
                " SELECT p::jsonb FROM unnest(%s::text[]) AS p",
                ([json.dumps(p) for p in payloads],),
            )
            return n

        def leaseq_bulk() -> int:
            queue.enqueue_many("bench", payloads)
            return n

        rows.append((f"enqueue_many ({n} jobs)", timed(leaseq_bulk), timed(raw_bulk)))

        for batch in (1, 10):

            def raw_drain(batch: int = batch) -> int:
                done = 0
                while claimed := raw.execute(RAW_CLAIM, (batch,)).fetchall():
                    ids = [r[0] for r in claimed]
                    raw.execute(RAW_COMPLETE, (ids, [r[2] for r in claimed]))
                    done += len(ids)
                    if done >= single * batch:
                        break
                return done

            def leaseq_drain(batch: int = batch) -> int:
                done = 0
                while claims := queue.claim("bench", limit=batch):
                    if batch == 1:
                        queue.complete(claims[0])
                    else:
                        queue.complete_many(claims)
                    done += len(claims)
                    if done >= single * batch:
                        break
                return done

            rows.append((f"claim + complete, batch {batch}", timed(leaseq_drain), timed(raw_drain)))

    print(f"{'operation':<32} {'leaseq/s':>10} {'raw/s':>10} {'ratio':>7}")
    for name, ours, theirs in rows:
        print(f"{name:<32} {ours:>10.0f} {theirs:>10.0f} {ours / theirs:>7.2f}")
    reset(url)


if __name__ == "__main__":
    main()
