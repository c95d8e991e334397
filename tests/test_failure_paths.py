"""The reference article's failure paths 3, 4, 6 and 7 against the real database.

Paths 1 and 2 (concurrent claimers, locked rows) live in test_concurrency.py,
path 5 (side effects and retries) in test_transactions.py.
"""

from __future__ import annotations

import pytest

import leaseq
from leaseq import JobStatus, LeaseLost

from .conftest import Clock

# -- path 3: a crashed worker's job is claimable again after its lease expires --


def test_expired_lease_is_reclaimed_with_new_version_and_attempt(
    queue: leaseq.Queue, clock: Clock
) -> None:
    job_id = queue.enqueue("reports", {"report_id": 1})
    (crashed,) = queue.claim("reports", lease=30)
    # The worker "crashes": it never writes again. Before expiry nobody gets the job.
    assert queue.claim("reports") == []
    clock.advance(31)
    (recovered,) = queue.claim("reports", lease=30)
    assert recovered.job_id == job_id
    assert recovered.lease_version == crashed.lease_version + 1
    assert recovered.attempts == crashed.attempts + 1
    job = queue.get(job_id)
    assert job.history[-1]["outcome"] == "lease_expired"
    queue.complete(recovered)
    assert queue.get(job_id).status is JobStatus.DONE


def test_expired_leases_are_recovered_before_new_work(queue: leaseq.Queue, clock: Clock) -> None:
    first = queue.enqueue("reports", {"n": 1})
    queue.claim("reports", lease=5)
    newer = queue.enqueue("reports", {"n": 2}, priority=10)
    clock.advance(6)
    claims = queue.claim("reports", limit=1)
    assert [c.job_id for c in claims] == [first]
    assert [c.job_id for c in queue.claim("reports", limit=5)] == [newer]


def test_a_claim_returns_its_jobs_in_claim_order(queue: leaseq.Queue, clock: Clock) -> None:
    """Recovered leases first, then by priority (higher first), age, id: the order
    the README promises, kept in the returned list."""
    crashed = queue.enqueue("reports", {"n": "crashed"})
    queue.claim("reports", lease=5)
    old_low = queue.enqueue("reports", {"n": "old, low"})
    clock.advance(1)
    new_low = queue.enqueue("reports", {"n": "new, low"})
    urgent = queue.enqueue("reports", {"n": "urgent"}, priority=5)
    clock.advance(5)
    claims = queue.claim("reports", limit=10)
    assert [c.job_id for c in claims] == [crashed, urgent, old_low, new_low]


# -- path 4: a stale worker cannot write over a newer claim, nor its own expired one --


@pytest.mark.parametrize("operation", ["complete", "renew", "retry", "fail"])
def test_stale_worker_cannot_touch_newer_claim(
    queue: leaseq.Queue, clock: Clock, operation: str
) -> None:
    job_id = queue.enqueue("reports", {"report_id": 1})
    (stale,) = queue.claim("reports", lease=10)
    clock.advance(11)
    (fresh,) = queue.claim("reports", lease=60)
    before = queue.get(job_id)
    with pytest.raises(LeaseLost) as lost:
        _write(queue, operation, stale)
    assert (lost.value.job_id, lost.value.lease_version) == (job_id, stale.lease_version)
    assert queue.get(job_id) == before
    # The live owner is unaffected and can still finish.
    queue.complete(fresh)
    assert queue.get(job_id).status is JobStatus.DONE


@pytest.mark.parametrize("operation", ["complete", "renew", "retry", "fail"])
def test_expired_claim_is_lost_even_if_nobody_reclaimed(
    queue: leaseq.Queue, clock: Clock, operation: str
) -> None:
    job_id = queue.enqueue("reports", {"report_id": 1})
    (claim,) = queue.claim("reports", lease=10)
    clock.advance(10.5)
    before = queue.get(job_id)
    with pytest.raises(LeaseLost):
        _write(queue, operation, claim)
    assert queue.get(job_id) == before


# (A second fail of the same claim is a resend of its own committed write, accepted:
# see test_resends.py.)
@pytest.mark.parametrize("operation", ["complete", "renew", "retry"])
def test_writes_after_the_job_finished_are_lost(queue: leaseq.Queue, operation: str) -> None:
    queue.enqueue("reports", {})
    (claim,) = queue.claim("reports")
    queue.fail(claim, "bad input")
    with pytest.raises(LeaseLost):
        _write(queue, operation, claim)
    assert queue.get(claim.job_id).status is JobStatus.FAILED


def test_renew_keeps_a_long_job_alive(queue: leaseq.Queue, clock: Clock) -> None:
    queue.enqueue("reports", {})
    (claim,) = queue.claim("reports", lease=10)
    for _ in range(5):  # 40 seconds of work on a 10 second lease
        clock.advance(8)
        until = queue.renew(claim)
        assert queue.get(claim.job_id).lease_until == until
        assert queue.claim("reports") == []
    queue.complete(claim)


def test_renew_can_change_the_lease_duration(queue: leaseq.Queue, clock: Clock) -> None:
    queue.enqueue("reports", {})
    (claim,) = queue.claim("reports", lease=10)
    queue.renew(claim, lease=100)
    clock.advance(50)
    assert queue.claim("reports") == []
    queue.renew(claim)  # keeps the 100 s chosen last
    clock.advance(90)
    queue.complete(claim)


def test_completing_twice_after_an_ambiguous_commit_is_success(queue: leaseq.Queue) -> None:
    queue.enqueue("reports", {})
    (claim,) = queue.claim("reports")
    queue.complete(claim)
    queue.complete(claim)  # the caller could not tell whether the first COMMIT landed
    assert queue.get(claim.job_id).status is JobStatus.DONE


def test_completion_of_an_older_claim_is_not_mistaken_for_a_repeat(
    queue: leaseq.Queue, clock: Clock
) -> None:
    queue.enqueue("reports", {})
    (stale,) = queue.claim("reports", lease=5)
    clock.advance(6)
    (fresh,) = queue.claim("reports")
    queue.complete(fresh)
    with pytest.raises(LeaseLost):
        queue.complete(stale)


def test_retry_repeated_after_its_commit_is_accepted(queue: leaseq.Queue) -> None:
    queue.enqueue("reports", {})
    (claim,) = queue.claim("reports")
    assert queue.retry(claim, delay=60) is JobStatus.QUEUED
    assert queue.retry(claim, delay=60) is JobStatus.QUEUED


def test_batched_completion_reports_each_claim(queue: leaseq.Queue, clock: Clock) -> None:
    queue.enqueue_many("reports", [{"n": n} for n in range(3)])
    a, b = queue.claim("reports", limit=2, lease=5)
    clock.advance(6)
    (c,) = queue.claim("reports", lease=60)  # recovers one of the expired two
    results = {claim.job_id: ok for claim, ok in queue.complete_many([a, b])}
    assert results == {a.job_id: False, b.job_id: False}
    queue.complete(c)


# -- path 6: an exhausted job ends failed, never while its lease is valid -------------


def test_retries_exhaust_into_failed(queue: leaseq.Queue) -> None:
    job_id = queue.enqueue("reports", {}, max_attempts=3)
    outcomes = []
    for _ in range(3):
        (claim,) = queue.claim("reports")
        outcomes.append(queue.retry(claim, delay=0, error=RuntimeError("upstream 503")))
    assert outcomes == [JobStatus.QUEUED, JobStatus.QUEUED, JobStatus.FAILED]
    job = queue.get(job_id)
    assert (job.status, job.attempts) == (JobStatus.FAILED, 3)
    assert job.last_error == "RuntimeError: upstream 503"
    assert [h["outcome"] for h in job.history] == ["retry", "retry", "failed"]
    assert queue.claim("reports") == []


def test_repeated_crashes_end_failed_by_the_reaper(queue: leaseq.Queue, clock: Clock) -> None:
    job_id = queue.enqueue("reports", {}, max_attempts=3)
    for attempt in (1, 2, 3):
        (claim,) = queue.claim("reports", lease=10)
        assert claim.attempts == attempt
        clock.advance(11)  # crash: the lease runs out
    # Attempts are used up: the claim no longer selects it ...
    assert queue.claim("reports") == []
    # ... and the reaper moves it to failed.
    result = queue.reap()
    assert result.expired_running == (job_id,)
    job = queue.get(job_id)
    assert (job.status, job.attempts) == (JobStatus.FAILED, 3)
    assert "lease expired" in (job.last_error or "")
    assert queue.reap().failed == ()


def test_reaper_never_fails_a_job_whose_lease_is_valid(queue: leaseq.Queue, clock: Clock) -> None:
    job_id = queue.enqueue("reports", {}, max_attempts=1)
    (claim,) = queue.claim("reports", lease=30)
    assert claim.last_attempt
    clock.advance(20)
    assert len(queue.reap()) == 0
    assert queue.get(job_id).status is JobStatus.RUNNING
    queue.complete(claim)  # the last attempt may still succeed
    assert queue.get(job_id).status is JobStatus.DONE


def test_reaper_fails_queued_jobs_without_attempts_left(
    queue: leaseq.Queue, connect: object
) -> None:
    job_id = queue.enqueue("reports", {}, max_attempts=2)
    (claim,) = queue.claim("reports")
    queue.retry(claim, delay=0)
    # An operator lowers the budget below what was used (e.g. by editing the row).
    with queue.connection() as conn:
        conn.execute(
            f'UPDATE "{queue.schema}".job SET max_attempts = 1 WHERE job_id = %s', (job_id,)
        )
    assert queue.claim("reports") == []
    assert queue.reap().exhausted_queued == (job_id,)
    assert queue.get(job_id).status is JobStatus.FAILED


def test_failed_jobs_are_kept_and_replayed_with_their_identity(queue: leaseq.Queue) -> None:
    job_id = queue.enqueue("reports", {"report_id": 7}, max_attempts=1)
    (claim,) = queue.claim("reports")
    queue.fail(claim, ValueError("no such customer"))
    assert [j.job_id for j in queue.list_jobs("failed")] == [job_id]
    assert queue.replay(job_id) is True
    assert queue.replay(job_id) is False  # already queued: nothing to do
    (again,) = queue.claim("reports")
    assert again.job_id == job_id
    assert again.idempotency_key == claim.idempotency_key
    assert again.attempts == 1  # a fresh attempt budget
    assert again.lease_version > claim.lease_version  # fencing tokens only grow
    with pytest.raises(LeaseLost):  # the claim from before the replay is void
        queue.retry(claim, delay=0)
    queue.complete(again)
    history = queue.get(job_id).history
    assert [h["outcome"] for h in history] == ["failed", "replayed"]
    assert history[0]["error"] == "ValueError: no such customer"


def test_replay_and_cancel_of_missing_jobs(queue: leaseq.Queue) -> None:
    with pytest.raises(leaseq.JobNotFound):
        queue.replay(999_999)
    with pytest.raises(leaseq.JobNotFound):
        queue.cancel(999_999)
    with pytest.raises(leaseq.JobNotFound):
        queue.get(999_999)


def test_cancel_only_touches_queued_or_failed_jobs(queue: leaseq.Queue) -> None:
    queued = queue.enqueue("reports", {})
    running = queue.enqueue("reports", {})
    queue.claim("reports")  # takes `queued` (lower id)
    assert queue.get(queued).status is JobStatus.RUNNING
    assert queue.cancel(queued) is False
    assert queue.cancel(running) is True
    assert queue.get(running).status is JobStatus.CANCELLED
    assert queue.replay(running) is True
    assert queue.get(running).status is JobStatus.QUEUED


def test_default_retry_delay_is_bounded_backoff(queue: leaseq.Queue) -> None:
    queue.configure_queue("reports", backoff_base=10, backoff_cap=40, max_attempts=10)
    job_id = queue.enqueue("reports", {})
    delays = []
    for attempt in range(1, 6):
        (claim,) = queue.claim("reports")
        assert claim.attempts == attempt
        queue.retry(claim)
        job = queue.get(job_id)
        assert job.claimed_at is not None
        delays.append((job.available_at - job.claimed_at).total_seconds())
        # Make it claimable again without waiting.
        with queue.connection() as conn:
            conn.execute(
                f"UPDATE \"{queue.schema}\".job SET available_at = now() - interval '1 s'"
                " WHERE job_id = %s",
                (job_id,),
            )
    caps = [10, 20, 40, 40, 40]  # min(cap, base * 2^(attempt-1)), full jitter below it
    for delay, cap in zip(delays, caps, strict=True):
        assert 0 <= delay <= cap + 1


# -- helpers ------------------------------------------------------------------------


def _write(queue: leaseq.Queue, operation: str, claim: leaseq.Claim) -> None:
    if operation == "complete":
        queue.complete(claim)
    elif operation == "renew":
        queue.renew(claim)
    elif operation == "retry":
        queue.retry(claim, delay=0)
    else:
        queue.fail(claim, "stale")


def test_replay_failed_touches_only_its_queue(queue: leaseq.Queue) -> None:
    mine = queue.enqueue("reports", {}, max_attempts=1)
    other = queue.enqueue("emails", {}, max_attempts=1)
    for name in ("reports", "emails"):
        (claim,) = queue.claim(name)
        queue.fail(claim, "broken")
    assert queue.replay_failed("reports") == [mine]
    assert queue.get(mine).status is JobStatus.QUEUED
    assert queue.get(other).status is JobStatus.FAILED
    assert queue.replay_failed("reports") == []
