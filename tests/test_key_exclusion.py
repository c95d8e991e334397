"""Per-key ordering is mutual exclusion: while a job of a key runs, no other job
of that key is claimable, whatever order producers commit in, on first claim,
on recovery and after replays.

The oracle is the requirement itself ("never two running jobs of one key";
"nothing of a key is claimable while one of its jobs holds a live lease"),
checked on what the claims return, not a copy of the claim's SQL.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Callable

import psycopg
import pytest

import leaseq
from leaseq import JobStatus

from .clients import Client, ClientConnect
from .conftest import Clock

Connect = Callable[..., psycopg.Connection[tuple[object, ...]]]


def _claim_ids(client: Client, limit: int = 10, lease: float = 60) -> list[int]:
    return [c.job_id for c in client.claim("events", limit=limit, lease=lease)]


def test_an_earlier_job_enqueued_while_a_later_one_runs_waits(client: Client) -> None:
    """Reproduced defect (a): seq 1 arrives while seq 2 runs."""
    later = client.enqueue("events", {}, key="k", seq=2)
    (running,) = client.claim("events")
    assert running.job_id == later
    earlier = client.enqueue("events", {}, key="k", seq=1)
    assert _claim_ids(client) == []
    client.complete(running)
    assert _claim_ids(client) == [earlier]


def test_out_of_order_commits_of_two_producers_never_run_two_jobs_at_once(
    client: Client, client_connect: ClientConnect
) -> None:
    """Reproduced defect (b): A enqueues seq 1 in an open transaction, B enqueues
    seq 2 and commits, a claim takes seq 2, then A commits."""
    producer_a = client_connect()
    with producer_a.transaction():
        first = client.enqueue("events", {}, key="k", seq=1, conn=producer_a)
        second = client.enqueue("events", {}, key="k", seq=2)
        (running,) = client.claim("events")
        assert running.job_id == second
    # A has committed: seq 1 exists now, but seq 2 still holds the key.
    assert _claim_ids(client) == []
    client.complete(running)
    assert _claim_ids(client) == [first]


def test_a_producer_rollback_leaves_the_key_claimable(
    client: Client, client_connect: ClientConnect
) -> None:
    head = client.enqueue("events", {}, key="k", seq=5)
    producer = client_connect()
    with producer.transaction(force_rollback=True):
        # An earlier job, enqueued and rolled back: it must leave no trace.
        client.enqueue("events", {}, key="k", seq=1, conn=producer)
    assert _claim_ids(client) == [head]


def test_expired_lease_of_the_running_job_is_recovered_before_the_rest_of_its_key(
    client: Client, clock: Clock
) -> None:
    """(When an earlier job of the key committed while it ran, that one goes first:
    tests/test_ordering.py, the contract's "on lease recovery alike".)"""
    running = client.enqueue("events", {}, key="k", seq=1)
    later = client.enqueue("events", {}, key="k", seq=2)
    (crashed,) = client.claim("events", lease=10)
    assert crashed.job_id == running
    clock.advance(11)
    # The key's running job is recovered first, never run beside another of its key.
    (recovered,) = client.claim("events", limit=10, lease=10)
    assert (recovered.job_id, recovered.lease_version) == (running, crashed.lease_version + 1)
    assert _claim_ids(client) == []
    client.complete(recovered)
    assert _claim_ids(client) == [later]


def test_replayed_failed_head_waits_for_the_running_successor(client: Client) -> None:
    client.configure_queue("events", ordering_policy="continue")
    head = client.enqueue("events", {}, key="k", seq=1, max_attempts=1)
    second = client.enqueue("events", {}, key="k", seq=2)
    third = client.enqueue("events", {}, key="k", seq=3)
    (claim,) = client.claim("events")
    client.fail(claim, "boom")
    (successor,) = client.claim("events")
    assert successor.job_id == second
    assert client.replay(head) is True
    assert _claim_ids(client) == []  # the key's running job holds it
    client.complete(successor)
    # The replayed head is the earliest unfinished job again: it runs before `third`.
    assert _claim_ids(client) == [head]
    assert _claim_ids(client) == []
    del third


def test_replayed_skipped_head_waits_for_the_running_successor(client: Client) -> None:
    head = client.enqueue("events", {}, key="k", seq=1, max_attempts=1)
    second = client.enqueue("events", {}, key="k", seq=2)
    (claim,) = client.claim("events")
    client.fail(claim, "boom")
    assert _claim_ids(client) == []  # block: the failed head holds its key
    assert client.cancel(head) is True  # an operator skips it
    (successor,) = client.claim("events")
    assert successor.job_id == second
    assert client.replay(head) is True
    assert _claim_ids(client) == []
    client.complete(successor)
    assert _claim_ids(client) == [head]


def test_a_retried_job_runs_after_an_earlier_job_that_arrived_meanwhile(
    client: Client,
) -> None:
    later = client.enqueue("events", {}, key="k", seq=2)
    (running,) = client.claim("events")
    earlier = client.enqueue("events", {}, key="k", seq=1)
    client.retry(running, delay=0)
    # Nothing runs now; the earliest unfinished job is `earlier`, then `later`.
    assert _claim_ids(client, limit=1) == [earlier]
    assert _claim_ids(client) == []
    del later


def test_a_released_job_is_not_run_beside_another_of_its_key(client: Client) -> None:
    first = client.enqueue("events", {}, key="k", seq=1)
    client.enqueue("events", {}, key="k", seq=2)
    (running,) = client.claim("events")
    assert running.job_id == first
    client.release_many([running])
    assert _claim_ids(client) == [first]
    assert _claim_ids(client) == []


def test_cancelling_a_queued_head_moves_the_key_on(client: Client) -> None:
    first = client.enqueue("events", {}, key="k", seq=1)
    second = client.enqueue("events", {}, key="k", seq=2)
    assert client.cancel(first) is True
    assert _claim_ids(client) == [second]


def test_changing_the_policy_unblocks_or_blocks_keys_behind_failed_heads(
    client: Client,
) -> None:
    head = client.enqueue("events", {}, key="k", seq=1, max_attempts=1)
    second = client.enqueue("events", {}, key="k", seq=2)
    (claim,) = client.claim("events")
    client.fail(claim, "boom")
    assert _claim_ids(client) == []
    client.configure_queue("events", ordering_policy="continue")
    (successor,) = client.claim("events")
    assert successor.job_id == second
    client.complete(successor)
    third = client.enqueue("events", {}, key="k", seq=3)
    client.configure_queue("events", ordering_policy="block")
    assert _claim_ids(client) == []  # the failed head blocks its key again
    client.cancel(head)
    assert _claim_ids(client) == [third]


def test_many_keys_one_claim_takes_one_head_per_key(client: Client) -> None:
    for key in ("a", "b", "c"):
        client.enqueue_many("events", [{"key": key, "n": n} for n in range(4)], key=key)
    plain = client.enqueue_many("events", [{} for _ in range(3)])
    claims = client.claim("events", limit=100)
    keys = [c.key for c in claims if c.key is not None]
    assert sorted(keys) == ["a", "b", "c"]
    assert sorted(c.job_id for c in claims if c.key is None) == plain
    assert all(c.seq == 0 for c in claims if c.key is not None)


def test_reverse_order_producer_keeps_one_claimable_job_per_key(client: Client) -> None:
    """A producer that enqueues a key's jobs in descending seq: each claim still
    returns only the earliest, and the key drains in seq order."""
    ids = {seq: client.enqueue("events", {"seq": seq}, key="k", seq=seq) for seq in range(9, 0, -1)}
    order = []
    while claims := client.claim("events", limit=10):
        assert len(claims) == 1
        order.append(claims[0].seq)
        client.complete(claims[0])
    assert order == list(range(1, 10))
    del ids


# -- concurrent producers and claimers: the requirement, checked by an oracle ------------


def test_concurrent_producers_and_claimers_never_run_two_jobs_of_a_key(
    client: Client, client_connect: ClientConnect
) -> None:
    """4 producers enqueue into 12 keys in transactions that commit in random order
    (some roll back) while 4 claimers take and finish jobs. Every claim is checked
    against the jobs the claimers currently hold: a claim that returns a job of a
    held key is the failure. At the end every committed job is done (no key is
    left stuck) and nothing ran twice."""
    keys = [f"k{i}" for i in range(12)]
    held: dict[str, int] = {}  # key -> job id the claimers hold now
    lock = threading.Lock()
    violations: list[str] = []
    committed: set[int] = set()
    done: list[int] = []
    producers_left = [4]
    errors: list[BaseException] = []

    def produce(seed: int) -> None:
        rng = random.Random(seed)
        try:
            with client_connect() as conn:
                for _ in range(25):
                    ids = []
                    with conn.transaction(force_rollback=rng.random() < 0.15) as tx:
                        for _ in range(rng.randint(1, 3)):
                            key, seq = rng.choice(keys), rng.randint(0, 50)
                            ids.append(client.enqueue("events", {}, key=key, seq=seq, conn=conn))
                        if rng.random() < 0.5:
                            threading.Event().wait(rng.uniform(0, 0.02))
                    if not tx.force_rollback:
                        with lock:
                            committed.update(ids)
        except BaseException as exc:
            errors.append(exc)
        finally:
            with lock:
                producers_left[0] -= 1

    def consume(seed: int) -> None:
        rng = random.Random(seed)
        idle = 0
        try:
            # Once producers are done, stop after 2 s without a claim: a key whose
            # settling met a producer in flight is settled again within ~0.2 s.
            while idle < 200:
                claims = client.claim("events", limit=rng.randint(1, 4), lease=120)
                with lock:
                    for claim in claims:
                        assert claim.key is not None
                        if claim.key in held:
                            violations.append(
                                f"{claim.job_id} claimed while "
                                f"{held[claim.key]} of {claim.key} runs"
                            )
                        held[claim.key] = claim.job_id
                if not claims:
                    with lock:
                        finished_producing = producers_left[0] == 0
                    idle = idle + 1 if finished_producing else 0
                    threading.Event().wait(0.01)
                    continue
                threading.Event().wait(rng.uniform(0, 0.005))
                for claim in claims:
                    with lock:
                        del held[claim.key]  # type: ignore[arg-type]
                    if rng.random() < 0.1:
                        client.retry(claim, delay=0)
                    else:
                        client.complete(claim)
                        with lock:
                            done.append(claim.job_id)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=produce, args=(i,)) for i in range(4)]
    threads += [threading.Thread(target=consume, args=(100 + i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert not any(t.is_alive() for t in threads), "threads did not finish"
    assert not errors, errors
    assert violations == []
    assert len(done) == len(set(done)), "a job was completed twice"
    assert set(done) == committed, "committed jobs left undone (a key got stuck)"
    (stats,) = client.stats("events")
    assert (stats.queued, stats.running) == (0, 0)


@pytest.mark.parametrize("policy", ["block", "continue"])
def test_running_jobs_of_one_key_never_coexist_in_the_table(
    client: Client, clock: Clock, policy: str
) -> None:
    """Whatever the sequence of claims, recoveries, retries, failures and replays,
    the table never holds two running jobs of one key (checked after every step)."""
    client.configure_queue("events", ordering_policy=policy)
    rng = random.Random(policy)
    claims: list[leaseq.Claim] = []
    ids: list[int] = []
    for step in range(150):
        action = rng.choice(["enqueue", "enqueue", "claim", "claim", "finish", "expire", "replay"])
        if action == "enqueue":
            ids.append(
                client.enqueue(
                    "events", {}, key=rng.choice("ab"), seq=rng.randint(0, 5), max_attempts=2
                )
            )
        elif action == "claim":
            claims.extend(client.claim("events", limit=rng.randint(1, 3), lease=10))
        elif action == "finish" and claims:
            claim = claims.pop(rng.randrange(len(claims)))
            write = rng.choice(["complete", "retry", "fail", "release"])
            try:
                if write == "complete":
                    client.complete(claim)
                elif write == "retry":
                    client.retry(claim, delay=0)
                elif write == "fail":
                    client.fail(claim, "boom")
                else:
                    client.release_many([claim])
            except leaseq.LeaseLost:
                pass
        elif action == "expire":
            clock.advance(11)
            client.reap()
        elif action == "replay" and ids:
            client.replay(rng.choice(ids))
        with client.connection() as conn:
            rows = conn.execute(
                f'SELECT ordering_key, count(*) FROM "{client.schema}".job'
                " WHERE status = 'running' GROUP BY ordering_key HAVING count(*) > 1"
            ).fetchall()
        assert rows == [], f"step {step} ({action}): two running jobs of one key: {rows}"
    # Liveness: with leases expired and failed jobs skipped, everything drains.
    for _ in range(len(ids) + 5):
        clock.advance(11)
        client.reap()
        for job_id in ids:
            if client.get(job_id).status is JobStatus.FAILED:
                client.cancel(job_id)
        batch = client.claim("events", limit=10, lease=10)
        for claim in batch:
            client.complete(claim)
        if not batch and client.stats("events")[0].queued == 0:
            break
    (stats,) = client.stats("events")
    assert (stats.queued, stats.running) == (0, 0), stats


def test_a_claim_that_loses_the_race_for_a_key_is_retried_not_doubled(
    client: Client, connect: Connect
) -> None:
    """A claimer whose snapshot does not yet show another job of the key running
    (its claim is still committing) must not run a second job of that key: the
    unique index makes it wait for that commit and fail, and the claim is sent
    again, now seeing the key taken."""
    head = client.enqueue("events", {}, key="k", seq=5)
    other = connect()
    with other.transaction():
        # Another claimer's job of key k, running but not committed yet.
        other.execute(
            f'INSERT INTO "{client.schema}".job (queue, payload, payload_bytes, status,'
            " available_at, lease_until, lease_version, attempts, max_attempts,"
            " ordering_key, ordering_seq)"
            " VALUES ('events', '{}', 2, 'running', now(), now() + interval '1 hour',"
            " 1, 1, 20, 'k', 1)"
        )
        claimed: list[list[int]] = []
        claimer = threading.Thread(target=lambda: claimed.append(_claim_ids(client)))
        claimer.start()
        # The claimer took `head` on its snapshot and now waits on the unique index.
        with connect(autocommit=True) as watcher:
            for _ in range(500):
                row = watcher.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE %s = ANY(pg_blocking_pids(pid))",
                    (other.info.backend_pid,),
                ).fetchone()
                if row and row[0]:
                    break
                threading.Event().wait(0.01)
            else:
                pytest.fail("the claim never waited for the other claimer's commit")
    claimer.join(30)
    assert claimed == [[]]  # retried after the unique violation: the key is taken
    assert client.get(head).status is JobStatus.QUEUED
