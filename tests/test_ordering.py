"""Failure path 7: jobs of one ordering key run strictly in order."""

from __future__ import annotations

import pytest

import leaseq
from leaseq import JobStatus

from .conftest import Clock


def _claim_ids(queue: leaseq.Queue, limit: int = 10, lease: float = 30) -> list[int]:
    return [c.job_id for c in queue.claim("events", limit=limit, lease=lease)]


def test_only_the_earliest_unfinished_job_of_a_key_is_eligible(queue: leaseq.Queue) -> None:
    a1 = queue.enqueue("events", {"n": 1}, key="customer-a", seq=1)
    a2 = queue.enqueue("events", {"n": 2}, key="customer-a", seq=2)
    b1 = queue.enqueue("events", {"n": 1}, key="customer-b", seq=1)
    free = queue.enqueue("events", {"n": 0})
    # One claim of ten: the heads of both keys and the unordered job, never a2.
    claims = queue.claim("events", limit=10)
    assert sorted(c.job_id for c in claims) == sorted([a1, b1, free])
    assert _claim_ids(queue) == []
    queue.complete(next(c for c in claims if c.job_id == a1))
    assert _claim_ids(queue) == [a2]


def test_sequence_not_insertion_order_decides(queue: leaseq.Queue) -> None:
    later = queue.enqueue("events", {}, key="k", seq=20)
    earlier = queue.enqueue("events", {}, key="k", seq=10)
    assert _claim_ids(queue) == [earlier]
    del later


def test_key_without_seq_runs_in_enqueue_order(queue: leaseq.Queue) -> None:
    ids = queue.enqueue_many("events", [{"n": n} for n in range(5)], key="k")
    order = []
    while claims := queue.claim("events", limit=5):
        assert len(claims) == 1
        order.append(claims[0].job_id)
        queue.complete(claims[0])
    assert order == ids


def test_later_job_waits_while_the_earlier_lease_is_expired(
    queue: leaseq.Queue, clock: Clock
) -> None:
    first = queue.enqueue("events", {}, key="k", seq=1)
    second = queue.enqueue("events", {}, key="k", seq=2)
    (crashed,) = queue.claim("events", lease=10)
    assert crashed.job_id == first
    clock.advance(11)
    # Recovery keeps the rule: the expired head is retried before `second`.
    assert _claim_ids(queue) == [first]
    assert _claim_ids(queue) == []
    del second


def test_a_retried_head_still_blocks_its_key(queue: leaseq.Queue, clock: Clock) -> None:
    first = queue.enqueue("events", {}, key="k", seq=1)
    queue.enqueue("events", {}, key="k", seq=2)
    (claim,) = queue.claim("events")
    queue.retry(claim, delay=30)
    assert _claim_ids(queue) == []  # the head is queued but not yet due
    clock.advance(31)
    assert _claim_ids(queue) == [first]


@pytest.mark.parametrize("policy", ["block", "continue"])
def test_failed_head_follows_the_queue_policy(queue: leaseq.Queue, policy: str) -> None:
    queue.configure_queue("events", ordering_policy=policy)
    first = queue.enqueue("events", {}, key="k", seq=1, max_attempts=1)
    second = queue.enqueue("events", {}, key="k", seq=2)
    (claim,) = queue.claim("events")
    queue.fail(claim, "permanent")
    if policy == "block":
        assert _claim_ids(queue) == []
        # An operator decides: skip the failed head (cancel), and the key moves on.
        assert queue.cancel(first) is True
    assert _claim_ids(queue) == [second]


def test_replayed_head_runs_before_the_rest_under_block(queue: leaseq.Queue) -> None:
    first = queue.enqueue("events", {}, key="k", seq=1, max_attempts=1)
    queue.enqueue("events", {}, key="k", seq=2)
    (claim,) = queue.claim("events")
    queue.fail(claim, "bug, since fixed")
    assert _claim_ids(queue) == []
    queue.replay(first)
    assert _claim_ids(queue) == [first]


@pytest.mark.parametrize("policy", ["block", "continue"])
def test_exhausted_by_crashes_head(queue: leaseq.Queue, clock: Clock, policy: str) -> None:
    queue.configure_queue("events", ordering_policy=policy)
    first = queue.enqueue("events", {}, key="k", seq=1, max_attempts=2)
    second = queue.enqueue("events", {}, key="k", seq=2)
    for _ in range(2):
        assert _claim_ids(queue, lease=5) == [first]
        clock.advance(6)
    # Exhausted and expired: still running until reaped, so the key waits.
    assert _claim_ids(queue) == []
    assert queue.reap().failed == (first,)
    assert queue.get(first).status is JobStatus.FAILED
    assert _claim_ids(queue) == ([] if policy == "block" else [second])


def test_keys_are_scoped_to_their_queue(queue: leaseq.Queue) -> None:
    queue.enqueue("events", {}, key="k", seq=1)
    other = queue.enqueue("other", {}, key="k", seq=2)
    assert [c.job_id for c in queue.claim("other")] == [other]


# The recovery of an expired lease of a key's running job, when an earlier job of
# the key arrived meanwhile, is in test_key_exclusion.py: the running job is
# recovered first (ordering is mutual exclusion), a change of contract.
