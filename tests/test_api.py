"""The public API: its names, and the async client's parity with the sync one."""

from __future__ import annotations

import inspect
import subprocess
import sys
from typing import Any

import pytest

import leaseq
from leaseq import JobStatus, LeaseLost

from .conftest import ROOT, AsyncClock


def test_public_names_are_pinned() -> None:
    assert sorted(leaseq.__all__) == [
        "ActivityMinute",
        "AlreadyCompleted",
        "App",
        "AsyncQueue",
        "AuditEntry",
        "BacklogFull",
        "Backoff",
        "BlockedKey",
        "Claim",
        "ClaimPlan",
        "Claims",
        "CleanupHolder",
        "DatabaseError",
        "DatabaseUnavailable",
        "FailedGroup",
        "FailedSummary",
        "Health",
        "IndexHealth",
        "InvalidArgument",
        "InvalidDatabaseURL",
        "InvalidJob",
        "InvalidResult",
        "Job",
        "JobContext",
        "JobFailed",
        "JobId",
        "JobIds",
        "JobNotFound",
        "JobPage",
        "JobStatus",
        "LeaseLost",
        "LeaseqError",
        "Maintenance",
        "Metrics",
        "NotMigrated",
        "OrderingPolicy",
        "PayloadTooLarge",
        "PermanentError",
        "PruneResult",
        "Queue",
        "QueueActivity",
        "QueueSettings",
        "QueueStats",
        "RENEWAL_BUSY",
        "ReapResult",
        "RenewalBusy",
        "ResultNotReady",
        "RetentionMode",
        "Retry",
        "ScheduleInfo",
        "StatementTimeout",
        "TableHealth",
        "TransientError",
        "UniqueKeyHeld",
        "Worker",
        "WorkerStats",
        "__version__",
        "database_url",
        "metrics",
    ]
    for name in leaseq.__all__:
        assert hasattr(leaseq, name)


def test_errors_share_one_base() -> None:
    for error in (
        leaseq.LeaseLost,
        leaseq.BacklogFull,
        leaseq.PayloadTooLarge,
        leaseq.InvalidJob,
        leaseq.JobNotFound,
        leaseq.NotMigrated,
        leaseq.UniqueKeyHeld,
        leaseq.ResultNotReady,
        leaseq.JobFailed,
        leaseq.InvalidResult,
        leaseq.DatabaseError,
    ):
        assert issubclass(error, leaseq.LeaseqError)
    assert issubclass(leaseq.InvalidJob, ValueError)
    assert issubclass(leaseq.PayloadTooLarge, leaseq.InvalidJob)


def test_the_generated_files_name_their_async_source() -> None:
    for generated, source in (
        ("_sync_client.py", "_async_client.py"),
        ("_sync_operators.py", "_async_operators.py"),
    ):
        header = (ROOT / "src" / "leaseq" / generated).read_text().split('"""', 2)[1]
        assert f"GENERATED from ``{source}``" in header, generated
        assert f"See ``{source}``" in header, generated


def test_a_worker_s_stats_type_is_public() -> None:
    app = leaseq.App()
    app.task("work")(lambda job: None)
    stats = leaseq.Worker(app, dsn="postgresql://nowhere/x").stats
    assert isinstance(stats, leaseq.WorkerStats)


def test_an_already_completed_error_says_the_claim_completed_the_job() -> None:
    error = leaseq.AlreadyCompleted(7, 2, "complete")
    assert "already completed" in str(error)
    assert "no longer the live claim" not in str(error)
    assert isinstance(error, leaseq.LeaseLost)


def test_the_sync_client_is_generated_from_the_async_one() -> None:
    """A hand edit of _sync_client.py (or an async edit not carried over) fails."""
    tool = ROOT / "tools" / "async_to_sync.py"
    done = subprocess.run(
        [sys.executable, str(tool), "--check"], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_sync_and_async_clients_agree_on_every_public_method() -> None:
    """Same names, parameters, defaults, annotations (Async names made sync) and
    docstrings; every async method is a coroutine or an async context manager."""

    def public(cls: type) -> dict[str, Any]:
        return {
            name: member
            for name, member in inspect.getmembers(cls, inspect.isfunction)
            if not name.startswith("_")
        }

    def sync_text(text: str) -> str:
        for name in ("AsyncQueue", "AsyncConnection", "AsyncIterator"):
            text = text.replace(name, name.removeprefix("Async"))
        return text

    sync, asynchronous = public(leaseq.Queue), public(leaseq.AsyncQueue)
    assert sync.keys() == asynchronous.keys()
    for name, member in asynchronous.items():
        assert inspect.signature(sync[name]).parameters.keys() == (
            inspect.signature(member).parameters.keys()
        ), name
        assert sync_text(str(inspect.signature(member))) == str(inspect.signature(sync[name]))
        assert member.__doc__ == sync[name].__doc__, name
        wrapped = getattr(member, "__wrapped__", None)
        assert inspect.iscoroutinefunction(member) or inspect.isasyncgenfunction(wrapped), name


async def test_async_queue_end_to_end(aqueue: leaseq.AsyncQueue, aclock: AsyncClock) -> None:
    ids = await aqueue.enqueue_many("reports", [{"n": 1}, {"n": 2}])
    one = await aqueue.enqueue("reports", {"n": 3}, key="k", seq=1, max_attempts=2)
    claims = await aqueue.claim("reports", limit=3, lease=10)
    assert sorted(c.job_id for c in claims) == sorted([*ids, one])
    first, second, third = claims
    await aqueue.complete(first)
    await aqueue.renew(second, lease=20)
    assert await aqueue.retry(third, delay=0, error="flaky") is JobStatus.QUEUED
    await aclock.advance(25)
    with pytest.raises(LeaseLost):
        await aqueue.complete(second)
    reclaimed = await aqueue.claim("reports", limit=5, lease=5)
    assert sorted(c.job_id for c in reclaimed) == sorted([second.job_id, third.job_id])
    by_id = {c.job_id: c for c in reclaimed}
    await aqueue.fail(by_id[second.job_id], "permanent")
    await aclock.advance(10)
    reaped = await aqueue.reap()
    assert reaped.expired_running == (third.job_id,)
    assert await aqueue.replay(second.job_id) is True
    assert await aqueue.cancel(second.job_id) is True
    job = await aqueue.get(third.job_id)
    assert (job.status, job.attempts) == (JobStatus.FAILED, 2)
    (stats,) = await aqueue.stats()
    assert stats.counts[JobStatus.DONE] == 1
    assert stats.counts[JobStatus.FAILED] == 1
    assert stats.counts[JobStatus.CANCELLED] == 1
    assert [j.job_id for j in await aqueue.list_jobs("failed")] == [third.job_id]
    settings = await aqueue.configure_queue("reports", max_attempts=3)
    assert settings.max_attempts == 3
    assert (await aqueue.queue_settings("reports")) == settings
    many = await aqueue.complete_many([first])
    assert many == [(first, True)]
    renewed = await aqueue.renew_many([first])
    assert renewed == [(first, None)]


def test_stats_report_what_operators_need(queue: leaseq.Queue, clock: object) -> None:
    queue.enqueue_many("reports", [{"n": n} for n in range(4)])
    queue.enqueue("reports", {"later": True}, delay=3600)
    a, b = queue.claim("reports", limit=2, lease=5)
    queue.complete(a)
    clock.advance(30)  # type: ignore[attr-defined]
    (stats,) = queue.stats("reports")
    assert stats.counts == {
        JobStatus.QUEUED: 3,
        JobStatus.RUNNING: 1,
        JobStatus.DONE: 1,
        JobStatus.FAILED: 0,
        JobStatus.CANCELLED: 0,
    }
    assert stats.expired_leases == 1
    assert stats.oldest_ready_age is not None
    assert 29 < stats.oldest_ready_age < 120
    assert stats.queued_bytes == 2 * len('{"n":0}') + len('{"later":true}')
    del b


def test_the_database_twins_agree() -> None:
    """Database and AsyncDatabase (hand-kept, small): the same methods with the same
    parameters and docstrings, but for the sessions only the async worker uses."""
    from leaseq._db import AsyncDatabase, Database

    def methods(cls: type) -> dict[str, Any]:
        return dict(inspect.getmembers(cls, inspect.isfunction))

    sync, asynchronous = methods(Database), methods(AsyncDatabase)
    assert set(asynchronous) - set(sync) == {"session", "listen"}
    assert set(sync) <= set(asynchronous)
    for name, member in sync.items():
        twin = asynchronous[name]
        assert list(inspect.signature(member).parameters) == list(
            inspect.signature(twin).parameters
        ), name
        assert member.__doc__ == twin.__doc__, name


def test_a_claim_carries_each_of_its_jobs_fields(queue: leaseq.Queue) -> None:
    """Every field of a Claim, decoded from the claim's row, is its own job's."""
    plain = queue.enqueue("fields", {"n": 1}, max_attempts=4)
    keyed = queue.enqueue(
        "fields",
        {"n": 2},
        key="customer-9",
        idempotency_key="report-77",
        timeout=12.5,
        priority=5,
    )
    first, second = queue.claim("fields", limit=2, lease=45)
    assert (first.job_id, second.job_id) == (keyed, plain)  # by priority
    job = queue.get(keyed)
    assert (first.queue, first.payload, first.lease_version, first.attempts) == (
        "fields",
        {"n": 2},
        1,
        1,
    )
    assert (first.max_attempts, first.key, first.seq) == (job.max_attempts, "customer-9", job.seq)
    assert first.seq is not None
    assert (first.idempotency_key, first.timeout, first.group) == ("report-77", 12.5, None)
    assert (first.lease_seconds, first.recovered) == (45, False)
    assert first.lease_until == job.lease_until
    assert first.claimed_at == job.claimed_at
    assert first.ready_at == job.available_at
    assert (second.max_attempts, second.key, second.seq, second.timeout) == (4, None, None, None)
    assert second.idempotency_key == f"{queue.schema}:{plain}"
    assert second.payload == {"n": 1}
