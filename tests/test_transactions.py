"""Transactional enqueue and failure path 5: effects in the same database happen once."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import psycopg
import pytest

import leaseq
from leaseq import JobStatus, LeaseLost

from .conftest import Clock

Connect = Callable[..., psycopg.Connection[Any]]


@pytest.fixture
def reports(queue: leaseq.Queue) -> str:
    """A business table whose rows are keyed by the job's idempotency key."""
    table = f'"{queue.schema}".report'
    with queue.connection() as conn:
        conn.execute(f"CREATE TABLE {table} (idempotency_key text PRIMARY KEY, body text NOT NULL)")
    return table


def _report_count(queue: leaseq.Queue, table: str) -> int:
    with queue.connection() as conn:
        row = conn.execute(f"SELECT count(*) FROM {table}").fetchone()
    assert row is not None
    return int(row[0])


def test_enqueue_commits_with_the_callers_transaction(
    queue: leaseq.Queue, connect: Connect
) -> None:
    conn = connect()
    with conn.transaction():
        job_id = queue.enqueue("reports", {"report_id": 1}, conn=conn)
        # Not visible to anyone else before the business transaction commits.
        assert queue.claim("reports") == []
    (claim,) = queue.claim("reports")
    assert claim.job_id == job_id


def test_enqueue_rolls_back_with_the_callers_transaction(
    queue: leaseq.Queue, connect: Connect
) -> None:
    conn = connect()
    with pytest.raises(ZeroDivisionError), conn.transaction():
        queue.enqueue("reports", {"report_id": 1}, conn=conn)
        queue.enqueue_many("reports", [{"n": n} for n in range(10)], conn=conn)
        raise ZeroDivisionError  # the business code fails after enqueueing
    assert queue.claim("reports", limit=100) == []
    # No job was written. (The queue's settings row was, on a connection of its
    # own: created inside this transaction it would have made every other
    # producer of the queue wait for it.)
    (stats,) = queue.stats()
    assert stats.queue == "reports"
    assert sum(stats.counts.values()) == 0


async def test_async_enqueue_in_callers_transaction(
    aqueue: leaseq.AsyncQueue, database_url: str
) -> None:
    async with await psycopg.AsyncConnection.connect(database_url) as conn:
        with pytest.raises(ZeroDivisionError):
            async with conn.transaction():
                await aqueue.enqueue("reports", {"n": 1}, conn=conn)
                raise ZeroDivisionError
        async with conn.transaction():
            await aqueue.enqueue("reports", {"n": 2}, conn=conn)
            assert await aqueue.claim("reports", limit=5) == []  # not committed yet
    claims = await aqueue.claim("reports", limit=5)
    assert [c.payload for c in claims] == [{"n": 2}]


def _wait_backend_gone(queue: leaseq.Queue, pid: int) -> None:
    deadline = time.monotonic() + 10
    with queue.connection() as conn:
        while conn.execute("SELECT 1 FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchone():
            assert time.monotonic() < deadline, "the dead client's backend lingers"
            time.sleep(0.02)


def _handler(queue: leaseq.Queue, conn: psycopg.Connection[Any], table: str, claim: Any) -> None:
    """The business effect keyed by the idempotency key, then the guarded completion."""
    conn.execute(
        f"INSERT INTO {table} (idempotency_key, body) VALUES (%s, %s)"
        " ON CONFLICT (idempotency_key) DO NOTHING",
        (claim.idempotency_key, f"report for {claim.payload}"),
    )
    queue.complete(claim, conn=conn)


def test_crash_before_commit_then_retry_leaves_one_business_row(
    queue: leaseq.Queue, clock: Clock, connect: Connect, reports: str
) -> None:
    job_id = queue.enqueue("reports", {"report_id": 42})
    (first,) = queue.claim("reports", lease=10)
    doomed = connect()
    doomed.execute("BEGIN")
    _handler(queue, doomed, reports, first)
    backend = doomed.info.backend_pid
    doomed.close()  # the worker dies before COMMIT: effect and completion vanish together
    _wait_backend_gone(queue, backend)  # the server notices the lost client asynchronously
    assert _report_count(queue, reports) == 0
    clock.advance(11)
    (retry,) = queue.claim("reports")
    assert retry.idempotency_key == first.idempotency_key
    with connect() as conn, conn.transaction():
        _handler(queue, conn, reports, retry)
    assert _report_count(queue, reports) == 1
    assert queue.get(job_id).status is JobStatus.DONE


def test_effect_committed_then_crash_then_retry_leaves_one_business_row(
    queue: leaseq.Queue, clock: Clock, connect: Connect, reports: str
) -> None:
    """The effect committed on its own but the completion never ran."""
    queue.enqueue("reports", {"report_id": 42})
    (first,) = queue.claim("reports", lease=10)
    with connect() as conn, conn.transaction():
        conn.execute(
            f"INSERT INTO {reports} (idempotency_key, body) VALUES (%s, 'v1')",
            (first.idempotency_key,),
        )
    clock.advance(11)  # crash: no completion
    (retry,) = queue.claim("reports")
    with connect() as conn, conn.transaction():
        _handler(queue, conn, reports, retry)
    assert _report_count(queue, reports) == 1


def test_stale_worker_business_write_rolls_back_with_its_lost_completion(
    queue: leaseq.Queue, clock: Clock, connect: Connect, reports: str
) -> None:
    queue.enqueue("reports", {"report_id": 42})
    (stale,) = queue.claim("reports", lease=10)
    clock.advance(11)
    (fresh,) = queue.claim("reports", lease=60)
    conn = connect()
    with pytest.raises(LeaseLost), conn.transaction():
        conn.execute(
            f"INSERT INTO {reports} (idempotency_key, body) VALUES (%s, 'stale')",
            (stale.idempotency_key,),
        )
        queue.complete(stale, conn=conn)
    assert _report_count(queue, reports) == 0
    with connect() as conn2, conn2.transaction():
        _handler(queue, conn2, reports, fresh)
    assert _report_count(queue, reports) == 1


def test_producer_idempotency_key_survives_attempts(queue: leaseq.Queue, clock: Clock) -> None:
    queue.enqueue("reports", {}, idempotency_key="invoice-2026-11-7")
    (first,) = queue.claim("reports", lease=5)
    clock.advance(6)
    (second,) = queue.claim("reports")
    assert first.idempotency_key == second.idempotency_key == "invoice-2026-11-7"
    assert first.lease_version != second.lease_version
