"""Resends and re-runs of fenced writes.

Each test runs on both clients (``client``), but the two about the worker's
parts (JobContext, the acknowledgements), which take their clients by name. Two
requirements that pull in opposite directions, each where it belongs:

* the worker's own acknowledgement (no effect rides on it), resent after an
  ambiguous commit, reports the write it already made, never a lost lease;
* inside a caller's transaction, where a business effect commits with the
  write, a re-run of the whole transaction is refused, so the effect rolls
  back instead of committing twice.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import psycopg
import pytest

import leaseq
from leaseq import AlreadyCompleted, JobStatus, LeaseLost
from leaseq._worker.context import JobContext
from leaseq._worker.outcomes import Answer, Kind, Outcome, Outcomes

from .clients import Client, ClientConnect, ClientConnection
from .conftest import AsyncClock

#: Seconds a statement may take to start waiting for a lock, or to end once the
#: lock is gone, before the test fails instead of hanging (a busy shared server).
PROMPT = 30.0


def _counter(client: Client) -> str:
    table = f'"{client.schema}".counter'
    with client.connection() as conn:
        conn.execute(f"CREATE TABLE {table} (n int NOT NULL)")
        conn.execute(f"INSERT INTO {table} VALUES (0)")
    return table


def _count(client: Client, table: str) -> int:
    with client.connection() as conn:
        row = conn.execute(f"SELECT n FROM {table}").fetchone()
    assert row is not None
    return int(row[0])


# -- a re-run of a committed effect transaction does not pass the fence --------------------


def test_rerun_of_a_committed_effect_and_completion_is_refused(
    client: Client, client_connect: ClientConnect
) -> None:
    table = _counter(client)
    client.enqueue("reports", {})
    (claim,) = client.claim("reports")
    conn = client_connect()

    def effect_and_completion() -> None:
        with conn.transaction():
            conn.execute(f"UPDATE {table} SET n = n + 1")
            client.complete(claim, conn=conn)

    effect_and_completion()
    with pytest.raises(AlreadyCompleted) as refused:
        effect_and_completion()  # e.g. a retry loop that did not see the first COMMIT
    assert isinstance(refused.value, LeaseLost)
    assert _count(client, table) == 1
    assert client.get(claim.job_id).status is JobStatus.DONE


# Not a client conformance test: the worker's JobContext takes both clients, by name.
def test_job_transaction_run_twice_commits_its_effect_once(
    queue: leaseq.Queue, aqueue: leaseq.AsyncQueue
) -> None:
    table = _counter(queue)
    queue.enqueue("reports", {})
    (claim,) = queue.claim("reports")
    job = JobContext(claim, queue, aqueue)
    with job.transaction() as conn:
        conn.execute(f"UPDATE {table} SET n = n + 1")
    with pytest.raises(AlreadyCompleted), job.transaction() as conn:
        conn.execute(f"UPDATE {table} SET n = n + 1")
    assert _count(queue, table) == 1


def _wait_until_waiting(
    connect: Callable[..., psycopg.Connection[Any]],
    waiter: ClientConnection,
    holder: ClientConnection,
) -> None:
    """Wait (bounded) until ``waiter``'s statement waits for a lock ``holder`` holds."""
    with connect(autocommit=True) as watcher:
        deadline = time.monotonic() + PROMPT
        while time.monotonic() < deadline:
            row = watcher.execute(
                "SELECT %s = ANY(pg_blocking_pids(%s))",
                (holder.info.backend_pid, waiter.info.backend_pid),
            ).fetchone()
            if row and row[0]:
                return
            time.sleep(0.01)
    pytest.fail("the re-run's completion never waited for the first run's row lock")


def test_rerun_whose_completion_waited_for_the_first_runs_commit_is_refused_as_already_completed(
    client: Client,
    client_connect: ClientConnect,
    connect: Callable[..., psycopg.Connection[Any]],
) -> None:
    """A re-run of the transaction while the first run is still committing: its
    completion waits for the first run's row lock, which then commits. The UPDATE
    reads the newest row version and misses, as it must, but the statement's
    snapshot, taken before that commit, still showed the job running: it said
    plain LeaseLost, and the caller could not tell its re-run from a lost lease."""
    table = f'"{client.schema}".effect'
    with client.connection() as conn:
        # (inserts only: the re-run's effect must not wait for the first run's)
        conn.execute(f"CREATE TABLE {table} (job_id bigint NOT NULL)")
    client.enqueue("reports", {})
    (claim,) = client.claim("reports")
    first, again = client_connect(), client_connect()
    refused: list[BaseException | None] = []

    def effect_and_completion(conn: ClientConnection) -> None:
        conn.execute(f"INSERT INTO {table} VALUES (%s)", (claim.job_id,))
        client.complete(claim, conn=conn)

    def rerun() -> None:
        try:
            with again.transaction():
                effect_and_completion(again)
        except BaseException as exc:  # (looked at below, in the test's thread)
            refused.append(exc)
        else:
            refused.append(None)

    rerunning = threading.Thread(target=rerun)
    with first.transaction():
        effect_and_completion(first)
        rerunning.start()
        _wait_until_waiting(connect, again, first)
    # The first run committed: the re-run's completion goes on.
    rerunning.join(PROMPT)
    assert not rerunning.is_alive()
    (error,) = refused
    assert isinstance(error, AlreadyCompleted), repr(error)
    with client.connection() as conn:
        assert conn.execute(f"SELECT count(*) FROM {table}").fetchone() == (1,)
    assert client.get(claim.job_id).status is JobStatus.DONE


@pytest.mark.parametrize("write", ["retry", "fail"])
def test_rerun_of_a_retry_or_fail_in_a_callers_transaction_is_refused(
    client: Client, client_connect: ClientConnect, write: str
) -> None:
    table = _counter(client)
    client.enqueue("reports", {})
    (claim,) = client.claim("reports")
    conn = client_connect()

    def run() -> None:
        with conn.transaction():
            conn.execute(f"UPDATE {table} SET n = n + 1")
            if write == "retry":
                client.retry(claim, delay=60, error="later", conn=conn)
            else:
                client.fail(claim, "for good", conn=conn)

    run()
    with pytest.raises(LeaseLost):
        run()
    assert _count(client, table) == 1


def test_batch_completion_in_a_callers_transaction_reports_earlier_completions(
    client: Client, client_connect: ClientConnect
) -> None:
    client.enqueue_many("reports", [{}, {}])
    first, second = client.claim("reports", limit=2)
    client.complete(first)
    conn = client_connect()
    with conn.transaction():
        results = client.complete_many([first, second], conn=conn)
    assert results == [(first, False), (second, True)]


# -- the worker's acknowledgements recognise their own committed write --------------------


def test_resent_fail_is_accepted(client: Client) -> None:
    client.enqueue("reports", {})
    (claim,) = client.claim("reports")
    client.fail(claim, "bad input")
    client.fail(claim, "bad input")  # the first COMMIT's answer was lost
    assert client.fail_many([claim], ["bad input"]) == [(claim, True)]
    job = client.get(claim.job_id)
    assert (job.status, job.last_error) == (JobStatus.FAILED, "bad input")
    assert [entry["outcome"] for entry in job.history] == ["failed"]


def test_resent_release_is_accepted(client: Client) -> None:
    client.enqueue("reports", {})
    (claim,) = client.claim("reports")
    assert client.release_many([claim]) == [(claim, True)]
    assert client.release_many([claim]) == [(claim, True)]
    job = client.get(claim.job_id)
    assert (job.status, job.attempts) == (JobStatus.QUEUED, 0)
    assert [entry["outcome"] for entry in job.history] == ["released"]


def test_resent_last_attempt_retry_reports_failed(client: Client) -> None:
    client.enqueue("reports", {}, max_attempts=1)
    (claim,) = client.claim("reports")
    assert client.retry(claim, error="boom") is JobStatus.FAILED
    assert client.retry(claim, error="boom") is JobStatus.FAILED
    assert [entry["outcome"] for entry in client.get(claim.job_id).history] == ["failed"]


def test_resend_after_the_job_moved_on_is_accepted_and_changes_nothing(
    client: Client,
) -> None:
    client.enqueue("reports", {})
    (first,) = client.claim("reports")
    client.release_many([first])
    (second,) = client.claim("reports")  # another worker took the released job
    before = client.get(first.job_id)
    assert client.release_many([first]) == [(first, True)]
    assert client.get(first.job_id) == before
    client.complete(second)  # the new owner is unaffected

    client.enqueue("failing", {})
    (failing,) = client.claim("failing")
    client.fail(failing, "boom")
    client.replay(failing.job_id)
    replayed = client.get(failing.job_id)
    client.fail(failing, "boom")  # a late resend of the fail from before the replay
    assert client.get(failing.job_id) == replayed


def test_a_different_write_of_the_same_claim_is_not_a_resend(client: Client) -> None:
    """A claim that retried cannot later fail or release: that is no resend."""
    client.enqueue("reports", {})
    (claim,) = client.claim("reports")
    client.retry(claim, delay=0)
    with pytest.raises(LeaseLost):
        client.fail(claim, "late")
    assert client.release_many([claim]) == [(claim, False)]
    (claim,) = client.claim("reports")
    client.release_many([claim])
    assert client.retry_many([claim], delays=[0]) == [(claim, None)]
    (claim,) = client.claim("reports")
    client.fail(claim, "for good")
    assert client.retry_many([claim], delays=[0]) == [(claim, None)]
    assert client.release_many([claim]) == [(claim, False)]
    assert client.get(claim.job_id).status is JobStatus.FAILED


class _CommitThenDrop(leaseq.AsyncQueue):
    """Each batch write reaches the database and commits, then the connection
    'drops' before the answer arrives: an ambiguous commit, the first time."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.dropped: list[str] = []

    async def _drop_once(self, name: str, result: Any) -> Any:
        if name not in self.dropped:
            self.dropped.append(name)
            raise leaseq.TransientError("server closed the connection unexpectedly")
        return result

    async def complete_many(self, claims: Any, **kwargs: Any) -> Any:
        return await self._drop_once("complete", await super().complete_many(claims, **kwargs))

    async def retry_many(self, claims: Any, **kwargs: Any) -> Any:
        return await self._drop_once("retry", await super().retry_many(claims, **kwargs))

    async def fail_many(self, claims: Any, errors: Any = None) -> Any:
        return await self._drop_once("fail", await super().fail_many(claims, errors))

    async def release_many(self, claims: Any, **kwargs: Any) -> Any:
        return await self._drop_once("release", await super().release_many(claims, **kwargs))


async def test_worker_acknowledgements_resent_after_an_ambiguous_commit_are_accepted(
    aqueue: leaseq.AsyncQueue, database_url: str, schema: str
) -> None:
    await aqueue.enqueue_many("work", [{}, {}, {}, {}])
    await aqueue.enqueue("last", {}, max_attempts=1)
    claims = await aqueue.claim("work", limit=4)
    (last,) = await aqueue.claim("last")
    async with _CommitThenDrop(database_url, schema=schema) as flaky:
        outcomes = Outcomes(flaky)
        flusher = __import__("asyncio").create_task(outcomes.run())
        try:
            answers = [
                await outcomes.report(Outcome(Kind.COMPLETE, claims[0])),
                await outcomes.report(Outcome(Kind.RETRY, claims[1], delay=30, error="later")),
                await outcomes.report(Outcome(Kind.FAIL, claims[2], error="for good")),
                await outcomes.report(Outcome(Kind.RELEASE, claims[3])),
                await outcomes.report(Outcome(Kind.RETRY, last, delay=0, error="exhausted")),
            ]
        finally:
            flusher.cancel()
    assert sorted(flaky.dropped) == ["complete", "fail", "release", "retry"]
    # Every one accepted, as what the database did: the exhausted job's retry failed it.
    assert answers == [
        Answer.COMPLETED,
        Answer.RETRIED,
        Answer.FAILED,
        Answer.RELEASED,
        Answer.FAILED,
    ]
    states = [(await aqueue.get(c.job_id)).status for c in [*claims, last]]
    assert states == [
        JobStatus.DONE,
        JobStatus.QUEUED,
        JobStatus.FAILED,
        JobStatus.QUEUED,
        JobStatus.FAILED,
    ]


# -- a resend after retention moved the job to the archive ---------------------------------


def _archive_at_once(client: Client, queue: str) -> None:
    client.configure_queue(
        queue, retention_mode="archive", retain_done=0, retain_failed=0, retain_cancelled=0
    )


def _pruned(client: Client, job_id: int) -> None:
    client.prune()
    with pytest.raises(leaseq.JobNotFound):
        client.get(job_id)


def test_resent_acknowledgements_of_an_archived_job_report_what_they_did(
    client: Client,
) -> None:
    """Retention may run between the first COMMIT (whose answer was lost) and the
    resend: the archive still says what this claim did, so the resend reports it,
    never a lost lease."""
    _archive_at_once(client, "work")
    client.enqueue("work", {})
    (done,) = client.claim("work")
    client.complete(done)
    _pruned(client, done.job_id)
    assert client.complete_many([done]) == [(done, True)]

    client.enqueue("work", {})
    (failed,) = client.claim("work")
    client.fail(failed, "for good")
    _pruned(client, failed.job_id)
    assert client.fail_many([failed], ["for good"]) == [(failed, True)]

    client.enqueue("work", {}, max_attempts=1)
    (exhausted,) = client.claim("work")
    assert client.retry(exhausted, error="boom") is JobStatus.FAILED
    _pruned(client, exhausted.job_id)
    assert client.retry_many([exhausted], delays=[0]) == [(exhausted, JobStatus.FAILED)]

    client.enqueue("work", {})
    (released,) = client.claim("work")
    assert client.release_many([released]) == [(released, True)]
    (retried,) = client.claim("work")  # the released job, claimed again
    assert client.retry(retried, delay=0) is JobStatus.QUEUED
    (last,) = client.claim("work")
    client.complete(last)  # and then finished by a later claim
    _pruned(client, last.job_id)
    assert client.release_many([released]) == [(released, True)]
    assert client.retry_many([retried], delays=[0]) == [(retried, JobStatus.QUEUED)]

    # What is no resend stays lost: another claim's write, another kind of write.
    assert client.complete_many([released]) == [(released, False)]
    assert client.fail_many([done], ["late"]) == [(done, False)]
    assert client.release_many([last]) == [(last, False)]
    assert [row[0] for row in _archived(client)] == [
        done.job_id,
        failed.job_id,
        exhausted.job_id,
        last.job_id,
    ]


def _archived(client: Client) -> list[Any]:
    with client.connection() as conn:
        return list(
            conn.execute(
                f'SELECT job_id, status, lease_version FROM "{client.schema}".job_archive'
                " ORDER BY job_id"
            ).fetchall()
        )


def test_rerun_of_a_committed_completion_of_an_archived_job_is_refused_as_already_completed(
    client: Client, client_connect: ClientConnect
) -> None:
    table = _counter(client)
    _archive_at_once(client, "reports")
    client.enqueue("reports", {})
    (claim,) = client.claim("reports")
    conn = client_connect()

    def effect_and_completion() -> None:
        with conn.transaction():
            conn.execute(f"UPDATE {table} SET n = n + 1")
            client.complete(claim, conn=conn)

    effect_and_completion()
    _pruned(client, claim.job_id)
    with pytest.raises(AlreadyCompleted):
        effect_and_completion()
    assert _count(client, table) == 1


class _CommitPruneThenDrop(_CommitThenDrop):
    """The completion commits, retention removes the job at once (delete mode,
    retain_done=0), then the connection 'drops' before the answer arrives."""

    async def complete_many(self, claims: Any, **kwargs: Any) -> Any:
        result = await leaseq.AsyncQueue.complete_many(self, claims, **kwargs)
        await self.prune()
        return await self._drop_once("complete", result)


async def test_a_resend_whose_job_retention_deleted_says_so_not_that_the_lease_was_lost(
    aqueue: leaseq.AsyncQueue, database_url: str, schema: str, aclock: AsyncClock
) -> None:
    """Deleted, the job leaves nothing that says whether the first send committed:
    the answer says the job is gone (never a success nobody can vouch for, and not
    a lease lost, which it most likely was not)."""
    await aqueue.configure_queue("work", retain_done=0)
    await aqueue.enqueue("work", {})
    (claim,) = await aqueue.claim("work")
    async with _CommitPruneThenDrop(database_url, schema=schema) as flaky:
        outcomes = Outcomes(flaky)
        flusher = __import__("asyncio").create_task(outcomes.run())
        try:
            answer = await outcomes.report(Outcome(Kind.COMPLETE, claim))
        finally:
            flusher.cancel()
    assert flaky.dropped == ["complete"]
    with pytest.raises(leaseq.JobNotFound):
        await aqueue.get(claim.job_id)
    assert answer is Answer.GONE

    # Sent once (nothing ambiguous): a claim whose lease expired, and whose job
    # another claim finished and retention removed, lost its lease, as it says.
    await aqueue.enqueue("work", {})
    (expired,) = await aqueue.claim("work", lease=1)
    await aclock.advance(5)
    (recovered,) = await aqueue.claim("work")
    await aqueue.complete(recovered)
    await aqueue.prune()
    outcomes = Outcomes(aqueue)
    flusher = __import__("asyncio").create_task(outcomes.run())
    try:
        assert await outcomes.report(Outcome(Kind.COMPLETE, expired)) is Answer.LOST
    finally:
        flusher.cancel()
