"""Transactional enqueue and failure path 5: effects in the same database happen once.

On both clients, each in a caller's transaction on its own kind of connection.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row, namedtuple_row

import leaseq
from leaseq import DatabaseError, InvalidArgument, JobStatus, LeaseLost
from leaseq.testing import adrain

from .clients import Client, ClientConnect, ClientConnection
from .conftest import Clock
from .test_worker import Running


@pytest.fixture
def reports(client: Client) -> str:
    """A business table whose rows are keyed by the job's idempotency key."""
    table = f'"{client.schema}".report'
    with client.connection() as conn:
        conn.execute(f"CREATE TABLE {table} (idempotency_key text PRIMARY KEY, body text NOT NULL)")
    return table


def _report_count(client: Client, table: str) -> int:
    with client.connection() as conn:
        row = conn.execute(f"SELECT count(*) FROM {table}").fetchone()
    assert row is not None
    return int(row[0])


def test_enqueue_commits_with_the_callers_transaction(
    client: Client, client_connect: ClientConnect
) -> None:
    conn = client_connect()
    with conn.transaction():
        job_id = client.enqueue("reports", {"report_id": 1}, conn=conn)
        # Not visible to anyone else before the business transaction commits.
        assert client.claim("reports") == []
    (claim,) = client.claim("reports")
    assert claim.job_id == job_id


def test_enqueue_rolls_back_with_the_callers_transaction(
    client: Client, client_connect: ClientConnect
) -> None:
    conn = client_connect()
    with pytest.raises(ZeroDivisionError), conn.transaction():
        client.enqueue("reports", {"report_id": 1}, conn=conn)
        client.enqueue_many("reports", [{"n": n} for n in range(10)], conn=conn)
        raise ZeroDivisionError  # the business code fails after enqueueing
    assert client.claim("reports", limit=100) == []
    # No job was written. (The queue's settings row was, on a connection of its
    # own: created inside this transaction it would have made every other
    # producer of the queue wait for it.)
    (stats,) = client.stats()
    assert stats.queue == "reports"
    assert sum(stats.counts.values()) == 0


def _wait_backend_gone(client: Client, pid: int) -> None:
    deadline = time.monotonic() + 10
    with client.connection() as conn:
        while conn.execute("SELECT 1 FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchone():
            assert time.monotonic() < deadline, "the dead client's backend lingers"
            time.sleep(0.02)


def _handler(client: Client, conn: ClientConnection, table: str, claim: Any) -> None:
    """The business effect keyed by the idempotency key, then the guarded completion."""
    conn.execute(
        f"INSERT INTO {table} (idempotency_key, body) VALUES (%s, %s)"
        " ON CONFLICT (idempotency_key) DO NOTHING",
        (claim.idempotency_key, f"report for {claim.payload}"),
    )
    client.complete(claim, conn=conn)


def test_crash_before_commit_then_retry_leaves_one_business_row(
    client: Client, clock: Clock, client_connect: ClientConnect, reports: str
) -> None:
    job_id = client.enqueue("reports", {"report_id": 42})
    (first,) = client.claim("reports", lease=10)
    doomed = client_connect()
    doomed.execute("BEGIN")
    _handler(client, doomed, reports, first)
    backend = doomed.info.backend_pid
    doomed.close()  # the worker dies before COMMIT: effect and completion vanish together
    _wait_backend_gone(client, backend)  # the server notices the lost client asynchronously
    assert _report_count(client, reports) == 0
    clock.advance(11)
    (retry,) = client.claim("reports")
    assert retry.idempotency_key == first.idempotency_key
    with client_connect() as conn, conn.transaction():
        _handler(client, conn, reports, retry)
    assert _report_count(client, reports) == 1
    assert client.get(job_id).status is JobStatus.DONE


def test_effect_committed_then_crash_then_retry_leaves_one_business_row(
    client: Client, clock: Clock, client_connect: ClientConnect, reports: str
) -> None:
    """The effect committed on its own but the completion never ran."""
    client.enqueue("reports", {"report_id": 42})
    (first,) = client.claim("reports", lease=10)
    with client_connect() as conn, conn.transaction():
        conn.execute(
            f"INSERT INTO {reports} (idempotency_key, body) VALUES (%s, 'v1')",
            (first.idempotency_key,),
        )
    clock.advance(11)  # crash: no completion
    (retry,) = client.claim("reports")
    with client_connect() as conn, conn.transaction():
        _handler(client, conn, reports, retry)
    assert _report_count(client, reports) == 1


def test_stale_worker_business_write_rolls_back_with_its_lost_completion(
    client: Client, clock: Clock, client_connect: ClientConnect, reports: str
) -> None:
    client.enqueue("reports", {"report_id": 42})
    (stale,) = client.claim("reports", lease=10)
    clock.advance(11)
    (fresh,) = client.claim("reports", lease=60)
    conn = client_connect()
    with pytest.raises(LeaseLost), conn.transaction():
        conn.execute(
            f"INSERT INTO {reports} (idempotency_key, body) VALUES (%s, 'stale')",
            (stale.idempotency_key,),
        )
        client.complete(stale, conn=conn)
    assert _report_count(client, reports) == 0
    with client_connect() as conn2, conn2.transaction():
        _handler(client, conn2, reports, fresh)
    assert _report_count(client, reports) == 1


def test_producer_idempotency_key_survives_attempts(client: Client, clock: Clock) -> None:
    client.enqueue("reports", {}, idempotency_key="invoice-2026-11-7")
    (first,) = client.claim("reports", lease=5)
    clock.advance(6)
    (second,) = client.claim("reports")
    assert first.idempotency_key == second.idempotency_key == "invoice-2026-11-7"
    assert first.lease_version != second.lease_version


def test_a_database_refusal_leaseq_has_no_type_for_is_a_leaseq_error_with_its_sqlstate(
    client: Client, client_connect: ClientConnect
) -> None:
    """Not the driver's error: callers catch leaseq.LeaseqError (the driver's is
    the cause)."""
    conn = client_connect()
    with pytest.raises(ZeroDivisionError), conn.transaction():
        conn.execute("SET TRANSACTION READ ONLY")
        with pytest.raises(DatabaseError) as read_only:
            client.enqueue("reports", {"report_id": 1}, conn=conn)
        assert read_only.value.sqlstate == "25006"
        assert isinstance(read_only.value.__cause__, psycopg.errors.ReadOnlySqlTransaction)
        # The caller's transaction has failed: what leaseq sends next is refused too.
        with pytest.raises(DatabaseError) as failed:
            client.enqueue("reports", {"report_id": 2}, conn=conn)
        assert failed.value.sqlstate == "25P02"
        assert "SQLSTATE 25P02" in str(failed.value)
        raise ZeroDivisionError  # the caller rolls back
    assert client.claim("reports") == []


def test_a_connection_of_the_other_kind_is_refused_before_anything_is_written(
    queue: leaseq.Queue, database_url: str
) -> None:
    async def async_client_given_a_sync_connection() -> None:
        async with leaseq.AsyncQueue(database_url, schema=queue.schema) as aqueue:
            with (
                psycopg.connect(database_url) as sync_conn,
                pytest.raises(InvalidArgument, match=r"psycopg\.AsyncConnection"),
            ):
                await aqueue.enqueue("reports", {}, conn=sync_conn)  # type: ignore[arg-type]

    with pytest.raises(InvalidArgument, match=r"psycopg\.Connection"):
        queue.enqueue("reports", {}, conn="dbname=app")  # type: ignore[arg-type]
    asyncio.run(async_client_given_a_sync_connection())
    assert queue.stats() == []  # not even the queue's settings row


def test_a_payload_the_callers_connection_cannot_encode_is_refused_typed(
    queue: leaseq.Queue, database_url: str
) -> None:
    """Parameters go out as text in the connection's client_encoding: a LATIN1
    connection cannot carry "Łódź". It raised a raw UnicodeEncodeError."""
    with psycopg.connect(database_url, options="-c client_encoding=LATIN1") as conn:
        with pytest.raises(InvalidArgument, match="client_encoding"):
            queue.enqueue("reports", {"customer": "Łódź"}, conn=conn)
        conn.rollback()
        # What it can encode goes through, on the same connection.
        job_id = queue.enqueue("reports", {"customer": "Malmö"}, conn=conn)
        conn.commit()
    assert [job.job_id for job in queue.list_jobs("queued", queue="reports")] == [job_id]
    assert queue.get(job_id).payload == {"customer": "Malmö"}


def test_a_connection_in_pipeline_mode_is_refused_before_anything_is_written(
    queue: leaseq.Queue, database_url: str
) -> None:
    """Its results come at the pipeline's sync: leaseq read none, raised a raw
    IndexError, and the job was written all the same (a retry doubled it)."""

    async def async_client() -> None:
        async with (
            leaseq.AsyncQueue(database_url, schema=queue.schema) as aqueue,
            await psycopg.AsyncConnection.connect(database_url) as conn,
        ):
            async with conn.pipeline():
                with pytest.raises(InvalidArgument, match="pipeline"):
                    await aqueue.enqueue("reports", {}, conn=conn)
            await conn.commit()

    with psycopg.connect(database_url) as conn:
        with conn.pipeline():
            with pytest.raises(InvalidArgument, match="pipeline"):
                queue.enqueue("reports", {}, conn=conn)
            with pytest.raises(InvalidArgument, match="pipeline"):
                queue.enqueue_many("reports", [{}, {}], conn=conn)
        conn.commit()
    asyncio.run(async_client())
    assert queue.stats() == []  # nothing written, not even the queue's settings row


def test_a_connection_the_caller_closed_is_refused_before_anything_is_written(
    queue: leaseq.Queue, database_url: str
) -> None:
    """A connection closed by its own code is a mistake no retry mends: it was a
    TransientError ("try again"), whose retries failed for ever, and the queue's
    settings row was written first all the same."""

    async def async_client() -> None:
        async with leaseq.AsyncQueue(database_url, schema=queue.schema) as aqueue:
            conn = await psycopg.AsyncConnection.connect(database_url)
            await conn.close()
            with pytest.raises(InvalidArgument, match="closed"):
                await aqueue.enqueue("reports", {}, conn=conn)

    conn = psycopg.connect(database_url)
    conn.close()
    with pytest.raises(InvalidArgument, match="closed"):
        queue.enqueue("reports", {}, conn=conn)
    with pytest.raises(InvalidArgument, match="closed"):
        queue.enqueue_many("reports", [{}, {}], conn=conn)
    asyncio.run(async_client())
    assert queue.stats() == []  # nothing written, not even the queue's settings row


@pytest.mark.parametrize(
    "row_factory", [dict_row, namedtuple_row], ids=["dict_row", "namedtuple_row"]
)
def test_a_callers_connection_with_its_own_row_factory_works_as_any_other(
    client: Client, client_connect: ClientConnect, row_factory: Any
) -> None:
    """Applications often make their connections with dict_row: every leaseq call
    taking conn= must still read its own rows (it used to fail with KeyError 0)."""
    conn = client_connect(row_factory=row_factory)
    with conn.transaction():
        first = client.enqueue("reports", {"report_id": 1}, conn=conn)
        more = client.enqueue_many("reports", [{"report_id": 2}, {"report_id": 3}], conn=conn)
    claims = {claim.job_id: claim for claim in client.claim("reports", limit=3)}
    assert set(claims) == {first, *more}
    with conn.transaction():
        client.complete(claims[first], result={"pages": 3}, conn=conn)
        client.retry(claims[more[0]], delay=0, conn=conn)
        client.fail(claims[more[1]], "gave up", conn=conn)
    assert client.get(first).status is JobStatus.DONE
    assert client.result(first) == {"pages": 3}
    assert client.get(more[0]).status is JobStatus.QUEUED
    assert client.get(more[1]).status is JobStatus.FAILED


# -- a handler that completed its job through job.transaction(), then went on --


async def test_a_retry_asked_after_the_jobs_transaction_committed_is_no_lost_lease(
    aqueue: leaseq.AsyncQueue, schema: str
) -> None:
    """A handler completes its job through ``job.atransaction()`` (committed), then
    asks for a retry. The job is done and stays done; the worker must say so, as
    it does for any other exception raised after the completion ("raised after
    completing": counted done, on_success called). It counted a lost lease
    instead (leaseq_jobs_finished_total{outcome="lease_lost"}, which the README
    says to alert on), logged "lease lost" and never called on_success for a
    completion that committed."""
    app = leaseq.App(schema=schema)
    succeeded: list[int] = []

    @app.on_success
    def done(job: leaseq.JobContext, result: Any) -> None:
        succeeded.append(job.job_id)

    @app.task("reports", max_attempts=3)
    async def report(job: leaseq.JobContext) -> None:
        async with job.atransaction():
            pass
        job.retry(delay=600)

    job_id = await aqueue.enqueue("reports", {"n": 1})
    stats = await adrain(app)
    assert (await aqueue.get(job_id)).status is JobStatus.DONE
    assert (stats.completed, stats.lost_leases, stats.retried) == (1, 0, 0)
    assert succeeded == [job_id]


async def test_a_job_its_transaction_completed_is_done_when_the_stop_cuts_its_handler(
    aqueue: leaseq.AsyncQueue, database_url: str, schema: str
) -> None:
    """The same at a stop: the handler completed its job through
    ``job.atransaction()`` (committed), then goes on with other work past the
    stop's grace and is cancelled. Its job is done; the worker released it
    instead (refused by the fence: the job is no longer running), counted a lost
    lease and called no on_success hook for the committed completion."""
    app = leaseq.App(schema=schema)
    succeeded: list[int] = []
    committed = asyncio.Event()

    @app.on_success
    def done(job: leaseq.JobContext, result: Any) -> None:
        succeeded.append(job.job_id)

    @app.task("reports")
    async def report(job: leaseq.JobContext) -> None:
        async with job.atransaction():
            pass
        committed.set()
        await asyncio.sleep(30)  # e.g. cleaning up after the effect

    job_id = await aqueue.enqueue("reports", {"n": 1})
    worker = leaseq.Worker(
        app, dsn=database_url, poll_interval=0.1, maintenance=False, shutdown_grace=0.3
    )
    running = Running(worker)
    await asyncio.wait_for(committed.wait(), 20)
    await running.stop()
    assert (await aqueue.get(job_id)).status is JobStatus.DONE
    assert (worker.stats.completed, worker.stats.lost_leases) == (1, 0)
    assert succeeded == [job_id]


# -- the first use of a queue in a caller's transaction that rolls back --


@pytest.mark.xdist_group("cleanup_horizon")  # holds a snapshot open (see test_plans)
def test_a_rolled_back_first_use_of_a_queue_leaves_other_producers_unblocked(
    client: Client,
    client_class: type[Client],
    database_url: str,
    schema: str,
    client_connect: ClientConnect,
) -> None:
    """Under REPEATABLE READ a queue's settings row is made in the caller's
    transaction (a row committed elsewhere would be invisible to its snapshot).
    The client then took the queue for known: once that transaction rolled back,
    the row was made by the next enqueue, inside that caller's (READ COMMITTED)
    transaction, and every other producer of the queue waited for it to commit,
    which the README promises never happens."""
    snapshot = client_connect()
    with snapshot.transaction(force_rollback=True):
        snapshot.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        client.enqueue("fresh", {"n": 0}, conn=snapshot)
    options = {**leaseq._db.CONNECTION_OPTIONS, "options": "-c lock_timeout=3000"}
    producer = client_connect()
    with (
        producer.transaction(),
        client_class(database_url, schema=schema, connection_options=options) as other,
    ):
        client.enqueue("fresh", {"n": 1}, conn=producer)
        other.enqueue("fresh", {"n": 2})  # waited for `producer` (lock_timeout)
    assert client.stats("fresh")[0].queued == 2
