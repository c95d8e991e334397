"""The reference article's failure paths 3, 4, 6 and 7 against the real database.

Paths 1 and 2 (concurrent claimers, locked rows) live in test_concurrency.py,
path 5 (side effects and retries) in test_transactions.py.
"""

from __future__ import annotations

import pytest

import leaseq
from leaseq import JobStatus, LeaseLost

from .clients import Client
from .conftest import Clock

# -- path 3: a crashed worker's job is claimable again after its lease expires --


def test_expired_lease_is_reclaimed_with_new_version_and_attempt(
    client: Client, clock: Clock
) -> None:
    job_id = client.enqueue("reports", {"report_id": 1})
    (crashed,) = client.claim("reports", lease=30)
    # The worker "crashes": it never writes again. Before expiry nobody gets the job.
    assert client.claim("reports") == []
    clock.advance(31)
    (recovered,) = client.claim("reports", lease=30)
    assert recovered.job_id == job_id
    assert recovered.lease_version == crashed.lease_version + 1
    assert recovered.attempts == crashed.attempts + 1
    job = client.get(job_id)
    assert job.history[-1]["outcome"] == "lease_expired"
    client.complete(recovered)
    assert client.get(job_id).status is JobStatus.DONE


def test_expired_leases_are_recovered_before_new_work(client: Client, clock: Clock) -> None:
    first = client.enqueue("reports", {"n": 1})
    client.claim("reports", lease=5)
    newer = client.enqueue("reports", {"n": 2}, priority=10)
    clock.advance(6)
    claims = client.claim("reports", limit=1)
    assert [c.job_id for c in claims] == [first]
    assert [c.job_id for c in client.claim("reports", limit=5)] == [newer]


def test_a_claim_returns_its_jobs_in_claim_order(client: Client, clock: Clock) -> None:
    """Recovered leases first, then by priority (higher first), age, id: the order
    the README promises, kept in the returned list."""
    crashed = client.enqueue("reports", {"n": "crashed"})
    client.claim("reports", lease=5)
    old_low = client.enqueue("reports", {"n": "old, low"})
    clock.advance(1)
    new_low = client.enqueue("reports", {"n": "new, low"})
    urgent = client.enqueue("reports", {"n": "urgent"}, priority=5)
    clock.advance(5)
    claims = client.claim("reports", limit=10)
    assert [c.job_id for c in claims] == [crashed, urgent, old_low, new_low]


# -- path 4: a stale worker cannot write over a newer claim, nor its own expired one --


@pytest.mark.parametrize("operation", ["complete", "renew", "retry", "fail"])
def test_stale_worker_cannot_touch_newer_claim(
    client: Client, clock: Clock, operation: str
) -> None:
    job_id = client.enqueue("reports", {"report_id": 1})
    (stale,) = client.claim("reports", lease=10)
    clock.advance(11)
    (fresh,) = client.claim("reports", lease=60)
    before = client.get(job_id)
    with pytest.raises(LeaseLost) as lost:
        _write(client, operation, stale)
    assert (lost.value.job_id, lost.value.lease_version) == (job_id, stale.lease_version)
    assert client.get(job_id) == before
    # The live owner is unaffected and can still finish.
    client.complete(fresh)
    assert client.get(job_id).status is JobStatus.DONE


@pytest.mark.parametrize("operation", ["complete", "renew", "retry", "fail"])
def test_expired_claim_is_lost_even_if_nobody_reclaimed(
    client: Client, clock: Clock, operation: str
) -> None:
    job_id = client.enqueue("reports", {"report_id": 1})
    (claim,) = client.claim("reports", lease=10)
    clock.advance(10.5)
    before = client.get(job_id)
    with pytest.raises(LeaseLost):
        _write(client, operation, claim)
    assert client.get(job_id) == before


# (A second fail of the same claim is a resend of its own committed write, accepted:
# see test_resends.py.)
@pytest.mark.parametrize("operation", ["complete", "renew", "retry"])
def test_writes_after_the_job_finished_are_lost(client: Client, operation: str) -> None:
    client.enqueue("reports", {})
    (claim,) = client.claim("reports")
    client.fail(claim, "bad input")
    with pytest.raises(LeaseLost):
        _write(client, operation, claim)
    assert client.get(claim.job_id).status is JobStatus.FAILED


def test_renew_keeps_a_long_job_alive(client: Client, clock: Clock) -> None:
    client.enqueue("reports", {})
    (claim,) = client.claim("reports", lease=10)
    for _ in range(5):  # 40 seconds of work on a 10 second lease
        clock.advance(8)
        until = client.renew(claim)
        assert client.get(claim.job_id).lease_until == until
        assert client.claim("reports") == []
    client.complete(claim)


def test_renew_can_change_the_lease_duration(client: Client, clock: Clock) -> None:
    client.enqueue("reports", {})
    (claim,) = client.claim("reports", lease=10)
    client.renew(claim, lease=100)
    clock.advance(50)
    assert client.claim("reports") == []
    client.renew(claim)  # keeps the 100 s chosen last
    clock.advance(90)
    client.complete(claim)


def test_completing_twice_after_an_ambiguous_commit_is_success(client: Client) -> None:
    client.enqueue("reports", {})
    (claim,) = client.claim("reports")
    client.complete(claim)
    client.complete(claim)  # the caller could not tell whether the first COMMIT landed
    assert client.get(claim.job_id).status is JobStatus.DONE


def test_completion_of_an_older_claim_is_not_mistaken_for_a_repeat(
    client: Client, clock: Clock
) -> None:
    client.enqueue("reports", {})
    (stale,) = client.claim("reports", lease=5)
    clock.advance(6)
    (fresh,) = client.claim("reports")
    client.complete(fresh)
    with pytest.raises(LeaseLost):
        client.complete(stale)


def test_retry_repeated_after_its_commit_is_accepted(client: Client) -> None:
    client.enqueue("reports", {})
    (claim,) = client.claim("reports")
    assert client.retry(claim, delay=60) is JobStatus.QUEUED
    assert client.retry(claim, delay=60) is JobStatus.QUEUED


def test_batched_completion_reports_each_claim(client: Client, clock: Clock) -> None:
    client.enqueue_many("reports", [{"n": n} for n in range(3)])
    a, b = client.claim("reports", limit=2, lease=5)
    clock.advance(6)
    (c,) = client.claim("reports", lease=60)  # recovers one of the expired two
    results = {claim.job_id: ok for claim, ok in client.complete_many([a, b])}
    assert results == {a.job_id: False, b.job_id: False}
    client.complete(c)


# -- path 6: an exhausted job ends failed, never while its lease is valid -------------


def test_retries_exhaust_into_failed(client: Client) -> None:
    job_id = client.enqueue("reports", {}, max_attempts=3)
    outcomes = []
    for _ in range(3):
        (claim,) = client.claim("reports")
        outcomes.append(client.retry(claim, delay=0, error=RuntimeError("upstream 503")))
    assert outcomes == [JobStatus.QUEUED, JobStatus.QUEUED, JobStatus.FAILED]
    job = client.get(job_id)
    assert (job.status, job.attempts) == (JobStatus.FAILED, 3)
    assert job.last_error == "RuntimeError: upstream 503"
    assert [h["outcome"] for h in job.history] == ["retry", "retry", "failed"]
    assert client.claim("reports") == []


def test_repeated_crashes_end_failed_by_the_reaper(client: Client, clock: Clock) -> None:
    job_id = client.enqueue("reports", {}, max_attempts=3)
    for attempt in (1, 2, 3):
        (claim,) = client.claim("reports", lease=10)
        assert claim.attempts == attempt
        clock.advance(11)  # crash: the lease runs out
    # Attempts are used up: the claim no longer selects it ...
    assert client.claim("reports") == []
    # ... and the reaper moves it to failed.
    result = client.reap()
    assert result.expired_running == (job_id,)
    job = client.get(job_id)
    assert (job.status, job.attempts) == (JobStatus.FAILED, 3)
    assert "lease expired" in (job.last_error or "")
    assert client.reap().failed == ()


def test_reaper_never_fails_a_job_whose_lease_is_valid(client: Client, clock: Clock) -> None:
    job_id = client.enqueue("reports", {}, max_attempts=1)
    (claim,) = client.claim("reports", lease=30)
    assert claim.last_attempt
    clock.advance(20)
    assert len(client.reap()) == 0
    assert client.get(job_id).status is JobStatus.RUNNING
    client.complete(claim)  # the last attempt may still succeed
    assert client.get(job_id).status is JobStatus.DONE


def test_reaper_fails_queued_jobs_without_attempts_left(client: Client, connect: object) -> None:
    job_id = client.enqueue("reports", {}, max_attempts=2)
    (claim,) = client.claim("reports")
    client.retry(claim, delay=0)
    # An operator lowers the budget below what was used (e.g. by editing the row).
    with client.connection() as conn:
        conn.execute(
            f'UPDATE "{client.schema}".job SET max_attempts = 1 WHERE job_id = %s', (job_id,)
        )
    assert client.claim("reports") == []
    assert client.reap().exhausted_queued == (job_id,)
    assert client.get(job_id).status is JobStatus.FAILED


def test_failed_jobs_are_kept_and_replayed_with_their_identity(client: Client) -> None:
    job_id = client.enqueue("reports", {"report_id": 7}, max_attempts=1)
    (claim,) = client.claim("reports")
    client.fail(claim, ValueError("no such customer"))
    assert [j.job_id for j in client.list_jobs("failed")] == [job_id]
    assert client.replay(job_id) is True
    assert client.replay(job_id) is False  # already queued: nothing to do
    (again,) = client.claim("reports")
    assert again.job_id == job_id
    assert again.idempotency_key == claim.idempotency_key
    assert again.attempts == 1  # a fresh attempt budget
    assert again.lease_version > claim.lease_version  # fencing tokens only grow
    with pytest.raises(LeaseLost):  # the claim from before the replay is void
        client.retry(claim, delay=0)
    client.complete(again)
    history = client.get(job_id).history
    assert [h["outcome"] for h in history] == ["failed", "replayed"]
    assert history[0]["error"] == "ValueError: no such customer"


def test_replay_and_cancel_of_missing_jobs(client: Client) -> None:
    with pytest.raises(leaseq.JobNotFound):
        client.replay(999_999)
    with pytest.raises(leaseq.JobNotFound):
        client.cancel(999_999)
    with pytest.raises(leaseq.JobNotFound):
        client.get(999_999)


def test_cancel_only_touches_queued_or_failed_jobs(client: Client) -> None:
    queued = client.enqueue("reports", {})
    running = client.enqueue("reports", {})
    client.claim("reports")  # takes `queued` (lower id)
    assert client.get(queued).status is JobStatus.RUNNING
    assert client.cancel(queued) is False
    assert client.cancel(running) is True
    assert client.get(running).status is JobStatus.CANCELLED
    assert client.replay(running) is True
    assert client.get(running).status is JobStatus.QUEUED


def test_default_retry_delay_is_bounded_backoff(client: Client) -> None:
    client.configure_queue("reports", backoff_base=10, backoff_cap=40, max_attempts=10)
    job_id = client.enqueue("reports", {})
    delays = []
    for attempt in range(1, 6):
        (claim,) = client.claim("reports")
        assert claim.attempts == attempt
        client.retry(claim)
        job = client.get(job_id)
        assert job.claimed_at is not None
        delays.append((job.available_at - job.claimed_at).total_seconds())
        # Make it claimable again without waiting.
        with client.connection() as conn:
            conn.execute(
                f"UPDATE \"{client.schema}\".job SET available_at = now() - interval '1 s'"
                " WHERE job_id = %s",
                (job_id,),
            )
    caps = [10, 20, 40, 40, 40]  # min(cap, base * 2^(attempt-1)), full jitter below it
    for delay, cap in zip(delays, caps, strict=True):
        assert 0 <= delay <= cap + 1


# -- helpers ------------------------------------------------------------------------


def _write(client: Client, operation: str, claim: leaseq.Claim) -> None:
    if operation == "complete":
        client.complete(claim)
    elif operation == "renew":
        client.renew(claim)
    elif operation == "retry":
        client.retry(claim, delay=0)
    else:
        client.fail(claim, "stale")


def test_replay_failed_touches_only_its_queue(client: Client) -> None:
    mine = client.enqueue("reports", {}, max_attempts=1)
    other = client.enqueue("emails", {}, max_attempts=1)
    for name in ("reports", "emails"):
        (claim,) = client.claim(name)
        client.fail(claim, "broken")
    assert client.replay_failed("reports") == [mine]
    assert client.get(mine).status is JobStatus.QUEUED
    assert client.get(other).status is JobStatus.FAILED
    assert client.replay_failed("reports") == []
