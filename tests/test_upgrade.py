"""Upgrading a database an older leaseq left with work in flight.

leaseq 1 (migration 0001 only) let a late, earlier job of an ordering key run
beside the key's running one, so its databases may hold two running jobs of
one key. Migration 0002 states "one running job per key" as a unique index,
which refused such a database: the upgrade stopped until the jobs ended, and
under a steady stream of keyed work it might never pass.
"""

from __future__ import annotations

from datetime import datetime

import psycopg
import pytest

import leaseq
from leaseq.testing import drain

from .older_schemas import migrate_until

V1 = 1


def _running_v1_job(conn: psycopg.Connection[tuple[object, ...]], schema: str, seq: int) -> int:
    """A keyed job a leaseq 1 worker claimed and is running (lease live)."""
    row = conn.execute(
        f'INSERT INTO "{schema}".job (queue, payload, payload_bytes, status, available_at, '
        "lease_until, lease_seconds, lease_version, attempts, max_attempts, ordering_key, "
        "ordering_seq, claimed_at) VALUES ('work', %s, 10, 'running', now(), "
        "now() + interval '60 s', 60, 1, 1, 1, 'k', %s, now()) RETURNING job_id",
        (psycopg.types.json.Jsonb({"seq": seq}), seq),
    ).fetchone()
    assert row is not None
    return int(row[0])


def _v1_claim(queue: leaseq.Queue, job_id: int, lease_until: datetime) -> leaseq.Claim:
    """The claim the leaseq 1 worker holds for ``job_id`` (its first, lease version 1)."""
    return leaseq.Claim(
        job_id=job_id,
        queue="work",
        payload={},
        lease_version=1,
        attempts=1,
        max_attempts=1,
        key="k",
        seq=None,
        lease_until=lease_until,
        lease_seconds=60.0,
        idempotency_key=str(job_id),
    )


def test_a_v1_database_with_two_running_jobs_of_one_key_upgrades(
    database_url: str, schema: str
) -> None:
    migrate_until(database_url, schema, V1)
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(f"INSERT INTO \"{schema}\".queue (name) VALUES ('work')")  # (its enqueue's)
        # The key's job 2 ran first; job 1, committed late, then ran beside it.
        second = _running_v1_job(conn, schema, seq=2)
        first = _running_v1_job(conn, schema, seq=1)
        third = conn.execute(
            f'INSERT INTO "{schema}".job (queue, payload, payload_bytes, available_at, '
            "max_attempts, ordering_key, ordering_seq) VALUES ('work', '{\"seq\": 3}', 10, "
            "now(), 1, 'k', 3) RETURNING job_id"
        ).fetchone()
        assert third is not None
        lease_until = conn.execute(
            f'SELECT lease_until FROM "{schema}".job WHERE job_id = %s', (first,)
        ).fetchone()

    with leaseq.Queue(database_url, schema=schema) as queue:
        queue.migrate()  # raised UniqueViolation at job_running_key_idx

        with psycopg.connect(database_url) as conn:
            rows = conn.execute(
                f'SELECT job_id, status FROM "{schema}".job ORDER BY ordering_seq'
            ).fetchall()
        # Nothing lost, nothing finished, one running job for the key.
        assert [job_id for job_id, _ in rows] == [first, second, int(third[0])]
        assert [status for _, status in rows].count("running") == 1
        assert all(status in ("queued", "running") for _, status in rows)

        # The key keeps its earliest job running; its old worker may complete it.
        # The other was put back: its old worker's late write is refused.
        assert lease_until is not None
        assert dict(rows)[first] == "running"
        with pytest.raises(leaseq.LeaseLost):
            queue.complete(_v1_claim(queue, second, lease_until[0]))
        queue.complete(_v1_claim(queue, first, lease_until[0]))

        # The rest of the key runs, in order, its one attempt intact.
        ran: list[int] = []
        app = leaseq.App(schema=schema)

        @app.task("work")
        def work(job: leaseq.JobContext) -> None:
            ran.append(job.payload["seq"])

        drain(app, dsn=database_url)
        assert ran == [2, 3]
        for job_id in (first, second, int(third[0])):
            assert queue.get(job_id).status is leaseq.JobStatus.DONE
