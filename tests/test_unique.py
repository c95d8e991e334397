"""Unique jobs: while a job of a queue holds a unique key (unfinished, or done
less than its ``unique_for`` ago) no second job with that key is inserted, under
concurrent producers, rollbacks, retries and replays."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from typing import Any

import psycopg
import pytest

import leaseq
from leaseq import JobStatus

from .clients import Client, ClientConnect
from .conftest import Clock

Connect = Callable[..., psycopg.Connection[tuple[object, ...]]]


def _unfinished_with_key(connect: Connect, schema: str, queue: str, key: str) -> list[int]:
    with connect(autocommit=True) as conn:
        return [
            int(str(row[0]))
            for row in conn.execute(
                f'SELECT job_id FROM "{schema}".job WHERE queue = %s AND unique_key = %s'
                " AND status IN ('queued', 'running') ORDER BY job_id",
                (queue, key),
            )
        ]


def test_a_second_enqueue_returns_the_unfinished_job(client: Client) -> None:
    first = client.enqueue("invoices", {"n": 1}, unique_key="invoice:42")
    again = client.enqueue("invoices", {"n": 2}, unique_key="invoice:42")
    other = client.enqueue("invoices", {"n": 3}, unique_key="invoice:43")
    elsewhere = client.enqueue("refunds", {"n": 4}, unique_key="invoice:42")
    assert (first.existing, again.existing, other.existing, elsewhere.existing) == (
        False,
        True,
        False,
        False,
    )
    assert again == first
    assert len({first, other, elsewhere}) == 3
    assert client.get(first).payload == {"n": 1}  # the duplicate changed nothing
    assert client.get(first).unique_key == "invoice:42"
    assert [j.unique_key for j in client.list_jobs("queued", queue="invoices")] == [
        "invoice:43",
        "invoice:42",
    ]
    assert client.stats("invoices")[0].queued == 2


def test_a_running_job_holds_its_key_and_its_end_frees_it(client: Client) -> None:
    first = client.enqueue("invoices", {}, unique_key="k")
    (claim,) = client.claim("invoices")
    assert client.enqueue("invoices", {}, unique_key="k") == first
    client.complete(claim)
    second = client.enqueue("invoices", {}, unique_key="k")
    assert not second.existing
    assert second != first


@pytest.mark.parametrize("ending", ["fail", "cancel"])
def test_a_failed_or_cancelled_job_frees_its_key_even_with_unique_for(
    client: Client, ending: str
) -> None:
    first = client.enqueue("invoices", {}, unique_key="k", unique_for=3600)
    if ending == "fail":
        (claim,) = client.claim("invoices")
        client.fail(claim, error="broke")
    else:
        assert client.cancel(first)
    assert not client.enqueue("invoices", {}, unique_key="k").existing


def test_unique_for_holds_the_key_past_completion_then_lapses(client: Client, clock: Clock) -> None:
    first = client.enqueue("invoices", {}, unique_key="k", unique_for=60)
    (claim,) = client.claim("invoices")
    client.complete(claim)
    clock.advance(30)
    assert client.enqueue("invoices", {}, unique_key="k") == first
    clock.advance(31)
    second = client.enqueue("invoices", {}, unique_key="k")
    assert not second.existing
    # The lapsed hold moved on to the new job.
    assert client.enqueue("invoices", {}, unique_key="k") == second


def test_a_retried_job_keeps_its_key(client: Client) -> None:
    first = client.enqueue("invoices", {}, unique_key="k", max_attempts=3)
    (claim,) = client.claim("invoices")
    assert client.retry(claim, delay=0) is JobStatus.QUEUED
    assert client.enqueue("invoices", {}, unique_key="k") == first


def test_an_expired_lease_keeps_its_key(client: Client, clock: Clock) -> None:
    first = client.enqueue("invoices", {}, unique_key="k")
    (claim,) = client.claim("invoices")
    clock.advance(claim.lease_seconds + 1)
    assert client.enqueue("invoices", {}, unique_key="k") == first
    (recovered,) = client.claim("invoices")
    assert recovered.job_id == first


def test_a_replay_never_makes_a_second_unfinished_job_of_a_key(client: Client) -> None:
    failed = client.enqueue("invoices", {}, unique_key="k", max_attempts=1)
    (claim,) = client.claim("invoices")
    client.fail(claim, error="broke")
    holder = client.enqueue("invoices", {}, unique_key="k")
    with pytest.raises(leaseq.UniqueKeyHeld):
        client.replay(failed)
    assert client.replay_many([failed]) == []
    assert client.replay_failed("invoices") == []
    assert client.get(failed).status is JobStatus.FAILED
    # Once the holder is done, the replay goes through and holds the key again.
    (claim,) = client.claim("invoices")
    assert claim.job_id == holder
    client.complete(claim)
    assert client.replay(failed)
    assert client.enqueue("invoices", {}, unique_key="k") == failed


@pytest.mark.parametrize("bulk", ["replay_many", "replay_failed"])
def test_a_bulk_replay_racing_a_producer_for_a_key_leaves_that_job_and_replays_the_rest(
    queue: leaseq.Queue, connect: Connect, bulk: str
) -> None:
    """The producer's enqueue of the key commits while the replay's statement runs:
    the key's lock then found it held, and LQ003 rolled back the whole batch, the
    jobs that held no key included (UniqueKeyHeld, which only `replay` raises)."""
    racing = queue.enqueue("invoices", {}, unique_key="k", max_attempts=1)
    other = queue.enqueue("invoices", {}, unique_key="other", max_attempts=1)
    for claim in queue.claim("invoices", limit=2):
        queue.fail(claim, error="broke")
    producer = connect()
    holder = queue.enqueue("invoices", {}, unique_key="k", conn=producer)  # not committed
    result: list[Any] = []

    def replay() -> None:
        try:
            if bulk == "replay_many":
                result.append(queue.replay_many([racing, other]))
            else:
                result.append(queue.replay_failed("invoices"))
        except Exception as exc:
            result.append(exc)

    replaying = threading.Thread(target=replay)
    replaying.start()
    time.sleep(0.5)  # the replay's statement waits for the key's lock
    producer.commit()
    replaying.join(30)
    assert result == [[other]], result
    assert queue.get(racing).status is JobStatus.FAILED
    assert queue.get(other).status is JobStatus.QUEUED
    assert queue.get(holder).status is JobStatus.QUEUED
    assert _unfinished_with_key(connect, queue.schema, "invoices", "k") == [holder]


def test_a_bulk_replay_takes_one_job_per_key(client: Client) -> None:
    ids = [client.enqueue("invoices", {}, unique_key="k", max_attempts=1) for _ in range(1)]
    (claim,) = client.claim("invoices")
    client.fail(claim)
    ids.append(client.enqueue("invoices", {}, unique_key="k", max_attempts=1))
    (claim,) = client.claim("invoices")
    client.fail(claim)
    plain = client.enqueue("invoices", {}, max_attempts=1)
    (claim,) = client.claim("invoices")
    client.fail(claim)
    assert sorted(client.replay_failed("invoices")) == [ids[0], plain]
    assert client.get(ids[1]).status is JobStatus.FAILED


def test_enqueue_many_skips_the_duplicates_of_a_batch(client: Client) -> None:
    held = client.enqueue("invoices", {"n": 0}, unique_key="b")
    ids = client.enqueue_many(
        "invoices", [{"n": n} for n in range(1, 5)], unique_keys=["a", "b", "c", "a"]
    )
    assert ids.existing == (False, True, False, True)
    assert ids[1] == held
    assert ids[3] == ids[0]
    assert len(set(ids)) == 3
    assert client.get(ids[0]).payload == {"n": 1}
    assert client.get(ids[2]).payload == {"n": 3}
    assert client.stats("invoices")[0].queued == 3


@pytest.mark.parametrize("key", [None, "customer-7"])
def test_a_unique_batch_runs_in_the_order_it_was_given(client: Client, key: str | None) -> None:
    """As a plain batch does: first in, first out (and, under an ordering key
    without seqs, in enqueue order), whatever the order of its unique keys."""
    client.enqueue_many(
        "invoices", [{"n": n} for n in range(4)], unique_keys=["d", "b", "c", "a"], key=key
    )
    started = []
    while claims := client.claim("invoices", limit=1):
        (claim,) = claims
        started.append(claim.payload["n"])
        client.complete(claim)
    assert started == [0, 1, 2, 3]


def test_enqueue_many_without_unique_keys_reports_nothing_existing(client: Client) -> None:
    ids = client.enqueue_many("invoices", [{}, {}])
    assert ids.existing == (False, False)
    assert not client.enqueue("invoices", {}).existing


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"unique_for": 10}, "unique_for needs"),
        ({"unique_key": ""}, "non-empty"),
        ({"unique_key": "k" * 256}, "limit"),
        ({"unique_key": "k", "unique_for": -1}, "unique_for"),
        ({"unique_key": 7}, "non-empty string"),
    ],
)
def test_bad_unique_arguments_are_refused_and_write_nothing(
    client: Client, arguments: dict[str, Any], message: str
) -> None:
    with pytest.raises(leaseq.InvalidJob, match=message):
        client.enqueue("invoices", {}, **arguments)
    with pytest.raises(leaseq.InvalidJob):
        client.enqueue_many("invoices", [{}, {}], unique_keys=["a"])
    assert client.stats("invoices") == [] or client.stats("invoices")[0].queued == 0


def test_admission_counts_only_what_is_inserted(client: Client) -> None:
    client.configure_queue("invoices", max_queued_jobs=2)
    client.enqueue("invoices", {}, unique_key="k")
    for _ in range(5):  # duplicates take no room
        client.enqueue("invoices", {}, unique_key="k")
    client.enqueue("invoices", {}, unique_key="j")
    with pytest.raises(leaseq.BacklogFull):
        client.enqueue("invoices", {}, unique_key="l")
    assert client.enqueue("invoices", {}, unique_key="k").existing


def test_a_full_unique_batch_reports_the_jobs_really_queued(client: Client) -> None:
    """The refusal of a unique batch said "queue is full: 5 unfinished jobs" with one
    job queued: it counted the rows of the batch itself, which the refusal rolled
    back. The text must say what is queued, as a plain batch's does."""
    client.configure_queue("invoices", max_queued_jobs=5)
    client.enqueue("invoices", {}, unique_key="held")
    with pytest.raises(leaseq.BacklogFull) as refused:
        client.enqueue_many("invoices", [{}] * 6, unique_keys=["held", *"abcde"])
    assert "1 unfinished jobs" in str(refused.value), str(refused.value)
    assert client.queue_settings("invoices").backlog_jobs == 1  # type: ignore[union-attr]
    assert client.stats("invoices")[0].queued == 1
    # At the boundary: four new keys (and two duplicates) fill it exactly.
    ids = client.enqueue_many("invoices", [{}] * 6, unique_keys=["held", *"abca", "d"])
    assert ids.existing == (True, False, False, False, True, False)
    assert client.queue_settings("invoices").backlog_jobs == 5  # type: ignore[union-attr]
    # Full: a batch of duplicates only still answers, a new key is refused.
    assert client.enqueue_many("invoices", [{}, {}], unique_keys=["a", "held"]).existing == (
        True,
        True,
    )
    with pytest.raises(leaseq.BacklogFull, match="5 unfinished jobs"):
        client.enqueue_many("invoices", [{}, {}], unique_keys=["a", "e"])


def test_a_unique_batch_over_a_lowered_limit_still_answers_its_duplicates(
    client: Client,
) -> None:
    """A limit set below what is queued refuses new jobs; a batch whose every key is
    held inserts nothing, takes no room, and gets its holders' ids."""
    held = client.enqueue_many("invoices", [{}, {}, {}], unique_keys=["a", "b", "c"])
    client.configure_queue("invoices", max_queued_jobs=1)
    again = client.enqueue_many("invoices", [{}, {}], unique_keys=["c", "a"])
    assert list(again) == [held[2], held[0]]
    with pytest.raises(leaseq.BacklogFull, match="3 unfinished jobs"):
        client.enqueue_many("invoices", [{}, {}], unique_keys=["c", "z"])


def test_inside_the_callers_transaction_it_commits_and_rolls_back_with_it(
    client: Client, client_connect: ClientConnect
) -> None:
    conn = client_connect()
    with pytest.raises(ZeroDivisionError), conn.transaction():
        doomed = client.enqueue("invoices", {}, unique_key="k", conn=conn)
        assert client.enqueue("invoices", {}, unique_key="k", conn=conn) == doomed
        raise ZeroDivisionError  # the business code fails after enqueueing
    kept = client.enqueue("invoices", {}, unique_key="k")
    assert not kept.existing  # the rolled-back job held nothing
    with conn.transaction():
        assert client.enqueue("invoices", {}, unique_key="k", conn=conn) == kept


def test_a_rolled_back_producer_leaves_the_key_to_the_next(
    queue: leaseq.Queue, connect: Connect
) -> None:
    """Producer A enqueues in its open transaction; producer B's enqueue of the
    same key waits for A. A rolls back: B inserts. Run again with a commit: B
    gets A's job."""
    for outcome in ("rollback", "commit"):
        key = f"k-{outcome}"
        a = connect()
        first = queue.enqueue("invoices", {"by": "a"}, unique_key=key, conn=a)
        answer: list[leaseq.JobId] = []

        def produce(key: str = key, answer: list[leaseq.JobId] = answer) -> None:
            answer.append(queue.enqueue("invoices", {"by": "b"}, unique_key=key))

        b = threading.Thread(target=produce)
        b.start()
        time.sleep(0.3)
        assert not answer, "B must wait for A's transaction"
        (a.rollback if outcome == "rollback" else a.commit)()
        b.join(30)
        assert answer, "B never returned"
        if outcome == "rollback":
            assert not answer[0].existing
            assert queue.get(answer[0]).payload == {"by": "b"}
        else:
            assert answer[0] == first
            assert answer[0].existing


def test_repeatable_read_producers_never_insert_a_duplicate(
    queue: leaseq.Queue, connect: Connect
) -> None:
    """Under REPEATABLE READ, a holder committed after B's snapshot is not seen:
    B's insert meets it in the index and fails as a serialization failure (a
    transient error: retry the transaction), never a second job."""
    queue.enqueue("invoices", {}, unique_key="other")  # the queue's row predates B
    b = connect()
    b.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
    b.execute("SELECT 1")  # B's snapshot is taken now
    first = queue.enqueue("invoices", {}, unique_key="k")
    with pytest.raises(leaseq.TransientError):
        queue.enqueue("invoices", {}, unique_key="k", conn=b)
    b.rollback()
    assert _unfinished_with_key(connect, queue.schema, "invoices", "k") == [first]


@pytest.mark.parametrize("unique_key", [None, "k"])
def test_a_lone_repeatable_read_producer_enqueues_into_a_queue_never_used(
    client: Client, client_connect: ClientConnect, unique_key: str | None
) -> None:
    """The queue's settings row was committed on leaseq's own connection, after
    the caller's snapshot: the enqueue's own insert of it met the row it could
    not see, a serialization failure for a lone producer, every time."""
    conn = client_connect()
    conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
    conn.execute("SELECT 1")  # the snapshot is taken now
    job_id = client.enqueue("never-used", {"n": 1}, unique_key=unique_key, conn=conn)
    conn.execute("COMMIT")
    assert client.get(job_id).status is JobStatus.QUEUED
    assert client.queue_settings("never-used") is not None


def test_concurrent_producers_with_rollbacks_never_hold_a_key_twice(
    database_url: str, queue: leaseq.Queue, connect: Connect
) -> None:
    """8 producers, 1,000 keys, a third of their transactions rolled back, a
    worker finishing jobs meanwhile; a checker reads the table all along: at no
    moment two unfinished jobs of one key, and every committed enqueue's id is a
    job that had the key."""
    schema = queue.schema
    keys = [f"invoice:{n}" for n in range(1000)]
    stop = threading.Event()
    violations: list[Any] = []
    errors: list[BaseException] = []
    returned: list[tuple[str, int]] = []
    lock = threading.Lock()

    def producer(seed: int) -> None:
        rng = random.Random(seed)
        try:
            with leaseq.Queue(database_url, schema=schema) as client:
                conn = connect()
                deadline = time.monotonic() + 8
                while time.monotonic() < deadline:
                    key = rng.choice(keys[: rng.choice((20, 1000))])  # hot keys too
                    try:
                        with conn.transaction():
                            job_id = client.enqueue("invoices", {}, unique_key=key, conn=conn)
                            if rng.random() < 0.33:
                                raise _Rollback
                        with lock:
                            returned.append((key, job_id))
                    except _Rollback:
                        pass
                    except leaseq.TransientError:
                        pass  # a deadlock or serialization failure: the caller retries
        except BaseException as exc:  # reported by the test
            errors.append(exc)

    def finisher() -> None:
        with leaseq.Queue(database_url, schema=schema) as client:
            while not stop.is_set():
                claims = client.claim("invoices", limit=20)
                if claims:
                    client.complete_many(claims)
                else:
                    time.sleep(0.01)

    def checker() -> None:
        with connect(autocommit=True) as conn:
            while not stop.is_set():
                rows = conn.execute(
                    f'SELECT unique_key, count(*) FROM "{schema}".job'
                    " WHERE status IN ('queued', 'running') AND unique_key IS NOT NULL"
                    " GROUP BY unique_key HAVING count(*) > 1"
                ).fetchall()
                if rows:
                    violations.extend(rows)
                time.sleep(0.005)

    threads = [threading.Thread(target=producer, args=(n,)) for n in range(8)]
    helpers = [threading.Thread(target=finisher), threading.Thread(target=checker)]
    for thread in threads + helpers:
        thread.start()
    for thread in threads:
        thread.join(60)
    stop.set()
    for thread in helpers:
        thread.join(60)
    assert not errors, errors
    assert not violations, violations
    assert len(returned) > 500, "the producers hardly ran"
    with connect(autocommit=True) as conn:
        owners = dict(
            conn.execute(f'SELECT job_id, unique_key FROM "{schema}".job').fetchall()  # type: ignore[arg-type]
        )
    assert all(owners.get(job_id) == key for key, job_id in returned)


class _Rollback(Exception):
    pass
