"""Batched fenced writes: one statement, still fenced and reported per job."""

from __future__ import annotations

import pytest

import leaseq
from leaseq import JobStatus

from .clients import Client
from .conftest import Clock


def test_a_batch_reports_lost_and_live_claims_apart(client: Client, clock: Clock) -> None:
    client.enqueue_many("reports", [{"n": n} for n in range(3)])
    live, short, stale = client.claim("reports", limit=3, lease=30)
    client.renew(short, lease=5)
    clock.advance(6)  # `short` expired
    (newer,) = client.claim("reports")  # recovers `short` under a new version
    assert newer.job_id == short.job_id
    results = client.retry_many([live, short], delays=[0, 0], errors=["a", "b"])
    assert results == [(live, JobStatus.QUEUED), (short, None)]
    assert client.complete_many([stale, newer]) == [(stale, True), (newer, True)]


def test_batch_outcomes_per_job(client: Client, clock: Clock) -> None:
    ids = client.enqueue_many("reports", [{"n": n} for n in range(4)], max_attempts=3)
    claims = client.claim("reports", limit=4, lease=30)
    results = client.retry_many(claims[:2], delays=[0, 500], errors=["boom", ValueError("bad")])
    assert [status for _, status in results] == [JobStatus.QUEUED, JobStatus.QUEUED]
    first, second = (client.get(i) for i in ids[:2])
    assert first.last_error == "boom"
    assert second.last_error == "ValueError: bad"
    assert (second.available_at - first.available_at).total_seconds() > 400
    failed = client.fail_many(claims[2:3], ["broken"])
    assert failed == [(claims[2], True)]
    assert client.get(ids[2]).status is JobStatus.FAILED
    with pytest.raises(leaseq.InvalidArgument):
        client.retry_many(claims[3:], delays=[1, 2])


def test_release_gives_jobs_back_without_counting_the_attempt(client: Client, clock: Clock) -> None:
    ids = client.enqueue_many("reports", [{"n": n} for n in range(2)], max_attempts=1)
    live, expiring = client.claim("reports", limit=2, lease=30)
    client.renew(expiring, lease=5)
    clock.advance(6)
    results = client.release_many([live, expiring])
    assert results == [(live, True), (expiring, False)]  # the expired lease stays lost
    job = client.get(live.job_id)
    assert (job.status, job.attempts) == (JobStatus.QUEUED, 0)
    assert job.history[-1]["outcome"] == "released"
    # On its only attempt, a released job is claimable again at once.
    reclaimed = client.claim("reports", limit=2)
    assert [c.job_id for c in reclaimed] == [live.job_id]
    assert reclaimed[0].lease_version == live.lease_version + 1
    del ids
