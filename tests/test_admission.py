"""Bounded backlog: admission limits and payload caps; enqueue stays O(1)."""

from __future__ import annotations

import json
from typing import Any

import pytest

import leaseq
from leaseq import BacklogFull, JobStatus, PayloadTooLarge

from .clients import Client, ClientConnect, sync_only


def _job_count(client: Client) -> int:
    with client.connection() as conn:
        row = conn.execute(f'SELECT count(*) FROM "{client.schema}".job').fetchone()
    assert row is not None
    return int(row[0])


def test_max_queued_jobs_refuses_and_writes_nothing(client: Client) -> None:
    client.configure_queue("reports", max_queued_jobs=3)
    ids = [client.enqueue("reports", {"n": n}) for n in range(3)]
    with pytest.raises(BacklogFull, match="3 unfinished jobs, limit 3"):
        client.enqueue("reports", {"n": 3})
    with pytest.raises(BacklogFull):
        client.enqueue_many("reports", [{"n": 4}])
    assert _job_count(client) == 3
    # Finishing work makes room again; running jobs still count as backlog.
    (claim,) = client.claim("reports")
    with pytest.raises(BacklogFull):
        client.enqueue("reports", {"n": 5})
    client.complete(claim)
    client.enqueue("reports", {"n": 6})
    assert client.queue_settings("reports").backlog_jobs == 3  # type: ignore[union-attr]
    del ids


def test_every_way_of_finishing_releases_backlog(client: Client, clock: Any) -> None:
    client.configure_queue("reports", max_queued_jobs=100, max_attempts=1)
    for _ in range(5):
        client.enqueue("reports", {})
    a, b, c = client.claim("reports", limit=3, lease=5)
    client.complete(a)
    client.fail(b, "x")
    client.retry(c)  # the last attempt: goes to failed
    cancelled = client.enqueue("reports", {})
    client.cancel(cancelled)
    (d,) = client.claim("reports", limit=1, lease=5)
    clock.advance(6)
    client.reap()  # d's lease expired on its last attempt
    settings = client.queue_settings("reports")
    assert settings is not None
    assert settings.backlog_jobs == 1  # one job never claimed
    client.replay(b.job_id)  # replay counts it again
    assert client.queue_settings("reports").backlog_jobs == 2  # type: ignore[union-attr]
    del d


def test_enqueue_many_is_all_or_nothing(client: Client) -> None:
    client.configure_queue("reports", max_queued_jobs=10)
    client.enqueue_many("reports", [{}] * 8)
    with pytest.raises(BacklogFull):
        client.enqueue_many("reports", [{}] * 3)
    assert _job_count(client) == 8
    client.enqueue_many("reports", [{}] * 2)


def test_max_queued_bytes(client: Client) -> None:
    payload = {"blob": "x" * 90}
    size = len(json.dumps(payload, separators=(",", ":")))
    client.configure_queue("reports", max_queued_bytes=size * 2)
    client.enqueue("reports", payload)
    client.enqueue("reports", payload)
    with pytest.raises(BacklogFull, match="bytes"):
        client.enqueue("reports", payload)
    assert client.queue_settings("reports").backlog_bytes == 2 * size  # type: ignore[union-attr]


def test_a_payload_larger_than_the_whole_byte_limit_is_refused_for_good(
    client: Client,
) -> None:
    """A payload that could not fit even in an empty queue must never be told
    "full, try later" (BacklogFull): a retry loop on it would spin forever. It
    is refused as too large, whichever way it is enqueued, and nothing is
    written; payloads that do fit are still admitted."""
    client.configure_queue("reports", max_queued_bytes=100)
    huge = {"blob": "x" * 200}
    ways = {
        "enqueue": lambda: client.enqueue("reports", huge),
        "enqueue unique": lambda: client.enqueue("reports", huge, unique_key="k"),
        "enqueue_many": lambda: client.enqueue_many("reports", [{}, huge]),
        "enqueue_many unique": lambda: client.enqueue_many(
            "reports", [{}, huge], unique_keys=["a", "b"]
        ),
    }
    for way, call in ways.items():
        with pytest.raises(PayloadTooLarge, match="100") as refused:
            call()
        assert not isinstance(refused.value, BacklogFull), way
        assert _job_count(client) == 0, way
    assert client.queue_settings("reports").backlog_bytes == 0  # type: ignore[union-attr]
    client.enqueue("reports", {"small": 1})
    assert _job_count(client) == 1


def test_limit_set_on_a_queue_with_a_backlog_counts_what_is_there(client: Client) -> None:
    client.enqueue_many("reports", [{}] * 5)
    client.claim("reports", limit=2)
    settings = client.configure_queue("reports", max_queued_jobs=6)
    assert settings.backlog_jobs == 5
    client.enqueue("reports", {})
    with pytest.raises(BacklogFull):
        client.enqueue("reports", {})
    # Lifting the limit admits again.
    client.configure_queue("reports", max_queued_jobs=None)
    client.enqueue("reports", {})


def test_queue_payload_cap(client: Client) -> None:
    client.configure_queue("reports", max_payload_bytes=50)
    client.enqueue("reports", {"ok": "x" * 10})
    with pytest.raises(PayloadTooLarge, match="exceeds the limit of 50 bytes"):
        client.enqueue("reports", {"big": "x" * 100})
    with pytest.raises(PayloadTooLarge):
        client.enqueue_many("reports", [{"ok": 1}, {"big": "x" * 100}])
    assert _job_count(client) == 1


def test_global_payload_cap_is_checked_before_sending(
    client_class: type[Client], database_url: str, schema: str
) -> None:
    with client_class(database_url, schema=schema, max_payload_bytes=1000) as client:
        client.migrate()
        with pytest.raises(PayloadTooLarge):
            client.enqueue("reports", {"big": "x" * 2000})
        assert client.stats() == []  # nothing written, not even the queue row


@pytest.mark.parametrize("cap", [0, -1, 1.5, "1000", True])
def test_a_bad_global_payload_cap_is_refused(
    client_class: type[Client], database_url: str, schema: str, cap: object
) -> None:
    """Not taken for "no cap" (0 became the 1 MiB default) nor let through."""
    with pytest.raises(leaseq.InvalidArgument, match="max_payload_bytes"):
        client_class(database_url, schema=schema, max_payload_bytes=cap)  # type: ignore[arg-type]


def test_paused_queue_is_not_claimed(client: Client) -> None:
    client.enqueue("reports", {})
    client.configure_queue("reports", paused=True)
    assert client.claim("reports") == []
    assert client.stats("reports")[0].paused
    client.configure_queue("reports", paused=False)
    assert len(client.claim("reports")) == 1


def test_configure_queue_rejects_bad_settings_and_writes_nothing(client: Client) -> None:
    bad: list[dict[str, Any]] = [
        {"lease": 0},
        {"lease": -5},
        {"max_attempts": 0},
        {"max_attempts": True},
        {"ordering_policy": "sometimes"},
        {"max_queued_jobs": 0},
        {"backoff_base": 10, "backoff_cap": 5},
        {"paused": "yes"},
        {"colour": "blue"},
        {"max_payload_bytes": 2**28},  # more than jsonb holds
    ]
    for settings in bad:
        with pytest.raises(leaseq.InvalidArgument):
            client.configure_queue("reports", **settings)
    with pytest.raises(leaseq.InvalidJob):
        client.configure_queue("bad queue name!", lease=5)
    assert client.queue_settings("reports") is None


def test_configure_queue_naming_no_setting_shows_defaults_and_makes_no_queue(
    client: Client,
) -> None:
    """It made the settings row of a queue never used, which then showed in every
    listing of queues, though such a call "changes nothing"."""
    shown = client.configure_queue("never-used")
    assert shown.name == "never-used"
    assert shown.max_attempts == client.configure_queue("used", lease=30).max_attempts
    assert client.queue_settings("never-used") is None
    assert [s.queue for s in client.stats()] == ["used"]
    # A queue that has a row shows it, as it is.
    assert client.configure_queue("used").lease == 30


def test_settings_round_trip(client: Client) -> None:
    settings = client.configure_queue(
        "reports",
        lease=30,
        max_attempts=5,
        backoff_base=2,
        backoff_cap=60,
        ordering_policy="continue",
        max_queued_jobs=1000,
        max_queued_bytes=10**9,
        max_payload_bytes=4096,
        paused=False,
    )
    assert settings.lease == 30
    assert settings.max_attempts == 5
    assert (settings.backoff_base, settings.backoff_cap) == (2, 60)
    assert settings.ordering_policy is leaseq.OrderingPolicy.CONTINUE
    assert (settings.max_queued_jobs, settings.max_queued_bytes) == (1000, 10**9)
    assert settings.max_payload_bytes == 4096
    # Only the named settings change.
    assert client.configure_queue("reports", lease=45).max_attempts == 5
    job_id = client.enqueue("reports", {})
    assert client.get(job_id).max_attempts == 5
    (claim,) = client.claim("reports")
    assert claim.lease_seconds == 45


def _enqueue_buffers(client: Client) -> int:
    """Shared buffers the enqueue statement touches, from EXPLAIN (ANALYZE, BUFFERS).

    Measured on the second run in one session: the first also counts the catalog
    reads that fill a fresh backend's caches, which says nothing about the queue.
    """
    operation = client._store.enqueue("big", {"report_id": 1})
    (statement,) = operation.statements
    touched = []
    with client.connection() as conn, conn.transaction(force_rollback=True):
        for _ in range(2):
            (plan,) = conn.execute(
                "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + statement.sql, statement.params
            ).fetchone()  # type: ignore[misc]
            top = plan[0]["Plan"]
            touched.append(int(top["Shared Hit Blocks"] + top["Shared Read Blocks"]))
    return touched[-1]


@pytest.mark.slow
@pytest.mark.xdist_group("cleanup_horizon")  # reads plans after VACUUM (see test_plans)
@sync_only(
    "EXPLAINs the enqueue statement on raw SQL; both clients send that one statement "
    "(the store builds it), so the async leg would measure the same thing again"
)
def test_enqueue_cost_does_not_grow_with_the_backlog(client: Client) -> None:
    """No count(*) per enqueue: the same work with 1 or 1,000,000 queued jobs."""
    client.configure_queue("big", max_queued_jobs=10_000_000, max_queued_bytes=10**12)
    client.enqueue("big", {"report_id": 0})
    small = _enqueue_buffers(client)
    with client.connection() as conn:
        conn.execute(
            f'INSERT INTO "{client.schema}".job (queue, payload, payload_bytes, available_at,'
            "  max_attempts, counted)"
            " SELECT 'big', jsonb_build_object('report_id', i), 16, now(), 20, true"
            " FROM generate_series(1, 1000000) AS i"
        )
        conn.execute(
            f'INSERT INTO "{client.schema}".backlog AS b (queue, shard, jobs, bytes)'
            " VALUES ('big', 1, 1000000, 16000000)"
            # (the enqueue above may have used shard 1: shards follow the backend pid)
            " ON CONFLICT (queue, shard)"
            " DO UPDATE SET jobs = b.jobs + excluded.jobs, bytes = b.bytes + excluded.bytes"
        )
        conn.execute(f'VACUUM ANALYZE "{client.schema}".job')
    assert client.stats("big")[0].counts[JobStatus.QUEUED] == 1_000_001
    large = _enqueue_buffers(client)
    # A deeper b-tree costs a few more pages per index; scanning the backlog
    # would cost thousands.
    print(f"enqueue touched {small} buffers with 1 queued job, {large} with 1,000,001")
    assert large <= small + 25, (small, large)


@pytest.mark.slow
def test_enqueue_many_takes_100k_jobs_in_one_call(client: Client) -> None:
    payloads = [{"report_id": n} for n in range(100_000)]
    ids = client.enqueue_many("bulk", payloads, priority=3)
    assert len(ids) == 100_000
    assert ids == sorted(ids)
    assert client.stats("bulk")[0].counts[JobStatus.QUEUED] == 100_000
    # ids come back in payload order
    assert client.get(ids[0]).payload == {"report_id": 0}
    assert client.get(ids[-1]).payload == {"report_id": 99_999}


# -- replays respect admission limits, in bounded batches ---------------------------------


def _failed_jobs(client: Client, name: str, count: int) -> list[int]:
    """``count`` jobs of ``name`` that failed for good."""
    return _failed_payloads(client, name, [{"n": n} for n in range(count)])


def _failed_payloads(client: Client, name: str, payloads: list[Any]) -> list[int]:
    """Jobs of ``name`` with these payloads that failed for good, in one statement:
    one failure time, so the replay's oldest-failure-first order is their order."""
    ids = client.enqueue_many(name, payloads, max_attempts=1)
    while claims := client.claim(name, limit=500):
        client.fail_many(claims, ["boom"] * len(claims))
    return ids


def test_replay_failed_into_a_full_queue_replays_what_fits_then_refuses(
    client: Client,
) -> None:
    ids = _failed_jobs(client, "reports", 250)
    client.configure_queue("reports", max_queued_jobs=100)
    client.enqueue_many("reports", [{"new": n} for n in range(40)])
    with pytest.raises(BacklogFull) as full:
        client.replay_failed("reports", batch=50)
    # Room for 60: the oldest failures are replayed first, and not one more.
    assert sorted(full.value.replayed) == ids[:60]
    settings = client.queue_settings("reports")
    assert settings is not None
    assert settings.backlog_jobs == 100
    assert len(client.list_jobs("failed", queue="reports", limit=1000)) == 190
    assert len(client.list_jobs("queued", queue="reports", limit=1000)) == 100
    # A full queue refuses a single replay too, writing nothing.
    before = client.get(ids[60])
    with pytest.raises(BacklogFull):
        client.replay(ids[60])
    assert client.get(ids[60]) == before


def test_replay_failed_respects_the_byte_limit(client: Client) -> None:
    ids = _failed_jobs(client, "reports", 20)
    size = client.get(ids[0]).payload_bytes
    client.configure_queue("reports", max_queued_bytes=size * 5)
    with pytest.raises(BacklogFull) as full:
        client.replay_failed("reports")
    assert sorted(full.value.replayed) == ids[:5]


def test_replay_failed_runs_in_bounded_batches(client: Client) -> None:
    ids = _failed_jobs(client, "reports", 1000)
    assert sorted(client.replay_failed("reports", batch=150)) == ids
    # Each batch is one statement: its replay entries share one timestamp.
    batches: dict[str, int] = {}
    for job in client.list_jobs("queued", queue="reports", limit=1000):
        at = job.history[-1]["at"]
        batches[at] = batches.get(at, 0) + 1
    assert max(batches.values()) <= 150
    assert len(batches) >= 1000 // 150


#: The byte limits a failed job's payload may have outgrown since it was enqueued
#: (an operator lowered them): enqueued now, it would be refused as too large.
LOWERED_LIMITS = ("max_queued_bytes", "max_payload_bytes")
#: A payload of over 200 bytes, and the limit it outgrew.
BIG, LIMIT = {"blob": "x" * 200}, 100


def _replays(client: Client) -> list[leaseq.AuditEntry]:
    return [e for e in client.audit_log(queue="reports", limit=1000) if e.action == "replay"]


@pytest.mark.parametrize("limit", LOWERED_LIMITS)
def test_a_replay_of_a_payload_over_a_lowered_limit_is_refused_for_good(
    client: Client, limit: str
) -> None:
    """A failed job whose payload is now larger than its queue takes at all (the
    limit was lowered after it was enqueued): the replay is admission again, and
    enqueued now the payload would be refused as too large. "Queue full, try
    later" (BacklogFull) would be false for ever, however much the queue drains;
    it is refused as too large, and nothing is written. Once the limit is raised
    again, it replays."""
    (big,) = _failed_payloads(client, "reports", [BIG])
    client.configure_queue("reports", **{limit: LIMIT})
    before = client.get(big)
    with pytest.raises(PayloadTooLarge, match=limit) as refused:
        client.replay(big)
    assert not isinstance(refused.value, BacklogFull)
    assert client.get(big) == before
    assert client.queue_settings("reports").backlog_bytes == 0  # type: ignore[union-attr]
    assert _replays(client) == []
    client.configure_queue("reports", **{limit: 1000})
    assert client.replay(big)


@pytest.mark.parametrize("limit", LOWERED_LIMITS)
@pytest.mark.timeout(60)
def test_replay_failed_leaves_out_a_payload_over_a_lowered_limit_and_replays_the_rest(
    client: Client, limit: str
) -> None:
    """One such job, the oldest failure, made every later job refused too (room was
    counted as a running total from it), and every run of replay_failed said
    "full" and replayed nothing. It is left failed and out of the count; the others
    are replayed (in batches of one here: it must not stop the batches either),
    and a run with nothing else to replay is not "full"."""
    big, *small = _failed_payloads(client, "reports", [BIG] + [{"n": n} for n in range(5)])
    client.configure_queue("reports", **{limit: LIMIT})
    before = client.get(big)
    assert sorted(client.replay_failed("reports", batch=1)) == small
    assert client.get(big) == before
    assert client.replay_failed("reports") == []
    assert client.get(big) == before
    assert sorted(i for e in _replays(client) for i in e.job_ids) == small


@pytest.mark.parametrize("limit", LOWERED_LIMITS)
def test_replay_many_leaves_out_a_payload_over_a_lowered_limit_and_replays_the_rest(
    client: Client, limit: str
) -> None:
    big, *small = _failed_payloads(client, "reports", [BIG] + [{"n": n} for n in range(5)])
    client.configure_queue("reports", **{limit: LIMIT})
    before = client.get(big)
    assert sorted(client.replay_many([big, *small])) == small
    assert client.get(big) == before


@pytest.mark.parametrize("limit", LOWERED_LIMITS)
def test_a_payload_that_can_never_fit_leaves_its_unique_key_to_a_later_job(
    client: Client, limit: str
) -> None:
    """Two failed jobs of one unique key, the older one too large now: a replay puts
    back one job of a key, and it must be the one that can be put back, not none
    (the older one, left failed, must not take the key in its place)."""
    ids = []
    for payload in (BIG, {"n": 1}):  # one at a time: the key has one unfinished job
        ids.append(client.enqueue("reports", payload, unique_key="k", max_attempts=1))
        (claim,) = client.claim("reports")
        client.fail(claim, "boom")
    big, small = ids
    client.configure_queue("reports", **{limit: LIMIT})
    assert client.replay_many([big, small]) == [small]
    assert client.get(big).status is JobStatus.FAILED


def test_a_bulk_replay_counts_room_without_a_payload_that_can_never_fit(client: Client) -> None:
    """Room for three of the jobs that can fit: those three are replayed, oldest
    first, then BacklogFull; the older one too large for the whole queue takes no
    room and stays failed."""
    big, *small = _failed_payloads(client, "reports", [BIG] + [{"n": n} for n in range(10)])
    size = client.get(small[0]).payload_bytes
    assert client.get(big).payload_bytes > 8 * size
    client.configure_queue("reports", max_queued_bytes=5 * size)
    client.enqueue_many("reports", [{"n": 0}, {"n": 1}])  # room for three left
    with pytest.raises(BacklogFull) as full:
        client.replay_many([big, *small])
    assert sorted(full.value.replayed) == small[:3]
    client.configure_queue("reports", max_queued_bytes=8 * size)  # three more
    with pytest.raises(BacklogFull) as full:
        client.replay_failed("reports")
    assert sorted(full.value.replayed) == small[3:6]
    assert client.get(big).status is JobStatus.FAILED


def test_first_use_of_a_new_queue_inside_a_transaction_does_not_block_other_producers(
    client: Client,
    client_class: type[Client],
    database_url: str,
    schema: str,
    client_connect: ClientConnect,
) -> None:
    """A producer's open transaction that is the first to use queue `fresh` must
    not make other producers of `fresh` wait for it (they fail fast here if they
    would wait: lock_timeout)."""
    options = {**leaseq._db.CONNECTION_OPTIONS, "options": "-c lock_timeout=3000"}
    producer = client_connect()
    with (
        producer.transaction(),
        client_class(database_url, schema=schema, connection_options=options) as other,
    ):
        client.enqueue("fresh", {"n": 1}, conn=producer)
        other.enqueue("fresh", {"n": 2})
        other.enqueue_many("fresh", [{"n": 3}])
        other_tx = client_connect(options="-c lock_timeout=3000")
        with other_tx.transaction():
            other.enqueue("fresh", {"n": 4}, conn=other_tx)
    assert client.stats("fresh")[0].queued == 4


def test_a_refusal_inside_a_savepoint_leaves_the_callers_transaction_going(
    client: Client, client_connect: ClientConnect
) -> None:
    """The README's recipe: BacklogFull comes from the database, so it aborts the
    transaction it ran in; inside a savepoint only the savepoint is lost, and the
    business row still commits."""
    client.configure_queue("reports", max_queued_jobs=1)
    client.enqueue("reports", {"n": 0})
    conn = client_connect()
    conn.execute("CREATE TEMPORARY TABLE report (id int)")
    with conn.transaction():
        conn.execute("INSERT INTO report VALUES (1)")
        with pytest.raises(BacklogFull), conn.transaction():
            client.enqueue("reports", {"n": 1}, conn=conn)
        conn.execute("INSERT INTO report VALUES (2)")
    assert list(conn.execute("SELECT count(*) FROM report")) == [(2,)]
    assert _job_count(client) == 1


def test_overlapping_producers_are_counted_once_they_commit(
    client: Client, client_connect: ClientConnect
) -> None:
    """What the README says of a limit: open transactions do not see each other's
    jobs, so two may each pass it; once they commit the counters hold every job,
    and the queue refuses more until it drains below the limit."""
    client.configure_queue("reports", max_queued_jobs=10)
    first, second = client_connect(), client_connect()
    with first.transaction(), second.transaction():
        client.enqueue_many("reports", [{"n": n} for n in range(10)], conn=first)
        client.enqueue_many("reports", [{"n": n} for n in range(10)], conn=second)
    assert client.queue_settings("reports").backlog_jobs == 20  # type: ignore[union-attr]
    with pytest.raises(BacklogFull, match="20 unfinished jobs, limit 10"):
        client.enqueue("reports", {"n": 20})
    claims = client.claim("reports", limit=11)
    client.complete_many(list(claims))
    client.enqueue("reports", {"n": 21})
    assert _job_count(client) == 21


@pytest.mark.parametrize("unique", [False, True], ids=["plain", "unique"])
def test_an_empty_batch_is_never_refused_and_writes_nothing(
    client: Client, client_connect: ClientConnect, unique: bool
) -> None:
    """A batch of no jobs adds nothing to a queue: a full queue (a limit lowered
    below what is queued) refused it with BacklogFull, which aborted the caller's
    transaction, and on a queue never used it made the queue's row."""
    keys: dict[str, Any] = {"unique_keys": []} if unique else {}
    assert client.enqueue_many("unused", [], **keys) == []
    assert client.queue_names() == []
    client.enqueue_many("reports", [{}, {}], **({"unique_keys": ["a", "b"]} if unique else {}))
    client.configure_queue("reports", max_queued_jobs=1)
    assert client.enqueue_many("reports", [], **keys) == []
    conn = client_connect()
    with conn.transaction():
        assert client.enqueue_many("reports", [], conn=conn, **keys) == []
        conn.execute("SELECT 1")  # the transaction goes on
    assert _job_count(client) == 2
    assert client.queue_names() == ["reports"]
