"""Failure path 7: jobs of one ordering key run strictly in order."""

from __future__ import annotations

import pytest

import leaseq
from leaseq import JobStatus, LeaseLost
from leaseq.testing import drain

from .clients import Client, ClientConnect
from .conftest import Clock


def _claim_ids(client: Client, limit: int = 10, lease: float = 30) -> list[int]:
    return [c.job_id for c in client.claim("events", limit=limit, lease=lease)]


def test_only_the_earliest_unfinished_job_of_a_key_is_eligible(client: Client) -> None:
    a1 = client.enqueue("events", {"n": 1}, key="customer-a", seq=1)
    a2 = client.enqueue("events", {"n": 2}, key="customer-a", seq=2)
    b1 = client.enqueue("events", {"n": 1}, key="customer-b", seq=1)
    free = client.enqueue("events", {"n": 0})
    # One claim of ten: the heads of both keys and the unordered job, never a2.
    claims = client.claim("events", limit=10)
    assert sorted(c.job_id for c in claims) == sorted([a1, b1, free])
    assert _claim_ids(client) == []
    client.complete(next(c for c in claims if c.job_id == a1))
    assert _claim_ids(client) == [a2]


def test_sequence_not_insertion_order_decides(client: Client) -> None:
    later = client.enqueue("events", {}, key="k", seq=20)
    earlier = client.enqueue("events", {}, key="k", seq=10)
    assert _claim_ids(client) == [earlier]
    del later


def test_key_without_seq_runs_in_enqueue_order(client: Client) -> None:
    ids = client.enqueue_many("events", [{"n": n} for n in range(5)], key="k")
    order = []
    while claims := client.claim("events", limit=5):
        assert len(claims) == 1
        order.append(claims[0].job_id)
        client.complete(claims[0])
    assert order == ids


def test_later_job_waits_while_the_earlier_lease_is_expired(client: Client, clock: Clock) -> None:
    first = client.enqueue("events", {}, key="k", seq=1)
    second = client.enqueue("events", {}, key="k", seq=2)
    (crashed,) = client.claim("events", lease=10)
    assert crashed.job_id == first
    clock.advance(11)
    # Recovery keeps the rule: the expired head is retried before `second`.
    assert _claim_ids(client) == [first]
    assert _claim_ids(client) == []
    del second


def test_a_retried_head_still_blocks_its_key(client: Client, clock: Clock) -> None:
    first = client.enqueue("events", {}, key="k", seq=1)
    client.enqueue("events", {}, key="k", seq=2)
    (claim,) = client.claim("events")
    client.retry(claim, delay=30)
    assert _claim_ids(client) == []  # the head is queued but not yet due
    clock.advance(31)
    assert _claim_ids(client) == [first]


@pytest.mark.parametrize("policy", ["block", "continue"])
def test_failed_head_follows_the_queue_policy(client: Client, policy: str) -> None:
    client.configure_queue("events", ordering_policy=policy)
    first = client.enqueue("events", {}, key="k", seq=1, max_attempts=1)
    second = client.enqueue("events", {}, key="k", seq=2)
    (claim,) = client.claim("events")
    client.fail(claim, "permanent")
    if policy == "block":
        assert _claim_ids(client) == []
        # An operator decides: skip the failed head (cancel), and the key moves on.
        assert client.cancel(first) is True
    assert _claim_ids(client) == [second]


def test_replayed_head_runs_before_the_rest_under_block(client: Client) -> None:
    first = client.enqueue("events", {}, key="k", seq=1, max_attempts=1)
    client.enqueue("events", {}, key="k", seq=2)
    (claim,) = client.claim("events")
    client.fail(claim, "bug, since fixed")
    assert _claim_ids(client) == []
    client.replay(first)
    assert _claim_ids(client) == [first]


@pytest.mark.parametrize("policy", ["block", "continue"])
def test_exhausted_by_crashes_head(client: Client, clock: Clock, policy: str) -> None:
    client.configure_queue("events", ordering_policy=policy)
    first = client.enqueue("events", {}, key="k", seq=1, max_attempts=2)
    second = client.enqueue("events", {}, key="k", seq=2)
    for _ in range(2):
        assert _claim_ids(client, lease=5) == [first]
        clock.advance(6)
    # Exhausted and expired: still running until reaped, so the key waits.
    assert _claim_ids(client) == []
    assert client.reap().failed == (first,)
    assert client.get(first).status is JobStatus.FAILED
    assert _claim_ids(client) == ([] if policy == "block" else [second])


def test_keys_are_scoped_to_their_queue(client: Client) -> None:
    client.enqueue("events", {}, key="k", seq=1)
    other = client.enqueue("other", {}, key="k", seq=2)
    assert [c.job_id for c in client.claim("other")] == [other]


# The recovery of an expired lease of a key's running job, when an earlier job of
# the key arrived meanwhile, is in test_key_exclusion.py: the running job is
# recovered first (ordering is mutual exclusion), a change of contract.


def test_a_cancelled_running_head_holds_its_key_until_its_lease_would_have_ended(
    client: Client, clock: Clock
) -> None:
    """Cancelling a running job fences its claim at once, but its handler runs on
    until its worker hears of it (a notification, at the latest its next renewal).
    Its key's next job must not start beside it: not before the cut lease's end."""
    client.enqueue("events", {}, key="k", seq=1)
    second = client.enqueue("events", {}, key="k", seq=2)
    third = client.enqueue("events", {}, key="k", seq=3)
    (running,) = client.claim("events", lease=30)
    assert client.cancel(running.job_id, running=True)
    assert _claim_ids(client) == []
    clock.advance(20)
    assert _claim_ids(client) == []  # still within the cancelled claim's lease
    clock.advance(11)
    assert _claim_ids(client) == [second]  # the lease is over: the key moves on, in order
    assert _claim_ids(client) == []
    del third


@pytest.mark.parametrize(
    "then",
    ["the next job is cancelled", "a job is enqueued", "a failed job is replayed"],
)
def test_the_hold_of_a_cancelled_running_job_belongs_to_its_key(
    client: Client, clock: Clock, then: str
) -> None:
    """Whichever job becomes the key's head while the cancelled claim's handler
    may still run waits for the cut lease's end, not only the next one of the
    moment."""
    first = client.enqueue("events", {}, key="k", seq=1)
    if then == "a failed job is replayed":
        client.configure_queue("events", ordering_policy="continue")
        failed = client.enqueue("events", {}, key="k", seq=0, max_attempts=1)
        (doomed,) = client.claim("events")
        client.fail(doomed, "broken")
    (running,) = client.claim("events", lease=30)
    assert running.job_id == first
    second = client.enqueue("events", {}, key="k", seq=2)
    assert client.cancel(running.job_id, running=True)
    if then == "the next job is cancelled":
        later = client.enqueue("events", {}, key="k", seq=3)
        assert client.cancel(second)
    elif then == "a job is enqueued":
        assert client.cancel(second)
        later = client.enqueue("events", {}, key="k", seq=3)
    else:
        assert client.cancel(second)
        assert client.replay(failed)
        later = failed
    assert _claim_ids(client) == []  # the cancelled handler may still run
    clock.advance(20)
    assert _claim_ids(client) == []
    clock.advance(11)
    assert _claim_ids(client) == [later]


def test_a_job_released_while_its_handler_runs_on_holds_its_key_if_cancelled(
    client: Client, clock: Clock
) -> None:
    first = client.enqueue("events", {}, key="k", seq=1)
    second = client.enqueue("events", {}, key="k", seq=2)
    (running,) = client.claim("events", lease=30)
    assert running.job_id == first
    # A stopping worker gives the claim back while its thread runs on.
    assert client.release_many([running], handlers_running=[True]) == [(running, True)]
    assert client.cancel(first)  # an operator skips it meanwhile
    assert _claim_ids(client) == []
    clock.advance(31)
    assert _claim_ids(client) == [second]


@pytest.mark.parametrize("cut", ["cancelled", "released while its handler runs on"])
def test_a_cut_lease_holds_a_job_of_its_key_that_was_claimable_already(
    client: Client, clock: Clock, client_connect: ClientConnect, cut: str
) -> None:
    """A job of the key can be claimable (not waiting) while another of the key
    runs: a producer that re-blocked it rolled back, and a job that entered
    meanwhile skipped its locked row. The claim's own checks keep them one at a
    time; the hold of a lease cut short was only put on a head that went from
    waiting to claimable, so this one started at once, beside the handler still
    running on the cut lease."""
    head = client.enqueue("events", {"n": 10}, key="k", seq=10)
    rolled_back = client_connect()
    with rolled_back.transaction(force_rollback=True):
        # In flight: makes `head` wait behind it (and holds its row meanwhile) ...
        client.enqueue("events", {"n": 5}, key="k", seq=5, conn=rolled_back)
        # ... while another producer commits an earlier job, which passes that row by.
        first = client.enqueue("events", {"n": 1}, key="k", seq=1)
    (running,) = client.claim("events", limit=10, lease=30)
    assert running.job_id == first
    if cut == "cancelled":
        assert client.cancel(first, running=True)
    else:  # a stopping worker gives the claim back while its thread runs on
        assert client.release_many([running], handlers_running=[True]) == [(running, True)]
    assert _claim_ids(client) == []  # the cut handler may still run
    clock.advance(20)
    assert _claim_ids(client) == []
    clock.advance(11)  # the cut lease is over: the key moves on, in order
    assert _claim_ids(client) == ([head] if cut == "cancelled" else [first])


def test_the_reaper_drops_the_holds_that_ended(client: Client, clock: Clock) -> None:
    def holds() -> int:
        with client.connection() as conn:
            row = conn.execute(f'SELECT count(*) FROM "{client.schema}".key_hold').fetchone()
        assert row is not None
        return int(row[0])

    for key in ("a", "b"):
        client.enqueue("events", {}, key=key, seq=1)
    short, long = client.claim("events", limit=2, lease=10)
    client.renew(long, lease=60)
    assert client.cancel(short.job_id, running=True)
    assert client.cancel(long.job_id, running=True)
    client.reap()
    assert holds() == 2
    clock.advance(11)
    client.reap()
    assert holds() == 1  # the other one holds its key still


def test_a_cancelled_running_head_whose_lease_had_expired_lets_its_key_go_on(
    client: Client, clock: Clock
) -> None:
    client.enqueue("events", {}, key="k", seq=1)
    second = client.enqueue("events", {}, key="k", seq=2)
    (running,) = client.claim("events", lease=10)
    clock.advance(11)  # its worker is gone: nobody runs it any more
    assert client.cancel(running.job_id, running=True)
    assert _claim_ids(client) == [second]


@pytest.mark.parametrize("limited", [False, True], ids=["plain", "with limits"])
def test_an_earlier_job_committed_late_goes_before_the_recovery_of_a_later_one(
    client: Client, clock: Clock, limited: bool
) -> None:
    """DESIGN: only the earliest unfinished job of a key is eligible, on first
    claim and on lease recovery alike. seq 2 started; seq 1 committed after (a
    slow producer); seq 2's worker died. seq 1 runs next, then seq 2 again. (A
    queue with limits is claimed through claim_limited(): its recovery too.)"""
    if limited:
        client.configure_queue("events", max_running=5)
    second = client.enqueue("events", {}, key="k", seq=2)
    (crashed,) = client.claim("events", lease=10)
    assert crashed.job_id == second
    first = client.enqueue("events", {}, key="k", seq=1)
    other = client.enqueue("events", {})
    assert _claim_ids(client) == [other]  # seq 2 still holds the key
    clock.advance(11)
    (recovered,) = client.claim("events", limit=10, lease=10)
    assert recovered.job_id == first
    assert _claim_ids(client) == []  # one job of the key at a time
    with pytest.raises(LeaseLost):
        client.complete(crashed)  # the dead worker's claim is fenced out
    client.complete(recovered)
    (again,) = client.claim("events", limit=10)
    assert (again.job_id, again.attempts) == (second, 2)  # its crashed attempt counted
    job = client.get(second)
    assert [entry["outcome"] for entry in job.history] == ["lease_expired"]
    assert job.history[0]["requeued"] == "behind an earlier job of its key"


def test_a_worker_runs_an_earlier_job_committed_late_before_recovering_a_later_one(
    queue: leaseq.Queue, clock: Clock, database_url: str, schema: str
) -> None:
    """The same through the worker's own claim loop: the claim that puts the
    crashed job back asks for another claim, which the worker makes."""
    app = leaseq.App(schema=schema)
    ran: list[int] = []

    @app.task("events")
    def record(job: leaseq.JobContext) -> None:
        ran.append(job.payload["seq"])

    queue.enqueue("events", {"seq": 2}, key="k", seq=2)
    (crashed,) = queue.claim("events", lease=10)  # its worker dies
    queue.enqueue("events", {"seq": 1}, key="k", seq=1)  # a slow producer commits
    clock.advance(11)
    stats = drain(app, dsn=database_url)
    assert ran == [1, 2]
    assert stats.completed == 2
    with pytest.raises(LeaseLost):
        queue.complete(crashed)


@pytest.mark.parametrize("limited", [False, True], ids=["plain", "with limits"])
def test_each_claim_takes_a_job_while_leases_are_put_back_behind_earlier_ones(
    client: Client, clock: Clock, limited: bool
) -> None:
    """A claim that puts leases back found no job in its own snapshot: the call
    claims again until it has one or nothing is left to put back. (A claim that
    came back empty made a worker think the queue drained.)"""
    if limited:
        client.configure_queue("events", max_running=50)
    keys = [f"k{n}" for n in range(6)]
    for key in keys:
        client.enqueue("events", {}, key=key, seq=2)
    assert len(client.claim("events", limit=6, lease=10)) == 6  # their worker dies
    earlier = {client.enqueue("events", {}, key=key, seq=1) for key in keys}
    clock.advance(11)
    taken = []
    for _ in keys:
        (claim,) = client.claim("events", limit=1, lease=60)
        taken.append(claim.job_id)
    assert set(taken) == earlier


def test_a_lease_put_back_does_not_use_a_start_of_the_rate_window(
    client: Client, clock: Clock
) -> None:
    client.configure_queue("events", rate_limit=(1, 60))
    client.enqueue("events", {}, key="k", seq=2)
    client.claim("events", lease=10)  # the window's one start; its worker dies
    first = client.enqueue("events", {}, key="k", seq=1)
    clock.advance(70)  # the window is empty again, the lease expired
    claims = client.claim("events", limit=10, lease=10)
    assert [claim.job_id for claim in claims] == [first]
