"""Upgrading a database an older leaseq left with work in flight.

leaseq 1 (migration 0001 only) let a late, earlier job of an ordering key run
beside the key's running one, so its databases may hold two running jobs of
one key. Migration 0002 states "one running job per key" as a unique index,
which refused such a database: the upgrade stopped until the jobs ended, and
under a steady stream of keyed work it might never pass.
"""

from __future__ import annotations

from datetime import datetime

import psycopg
import pytest

import leaseq
from leaseq.testing import drain

from .older_schemas import migrate_until

V1 = 1


def _running_v1_job(conn: psycopg.Connection[tuple[object, ...]], schema: str, seq: int) -> int:
    """A keyed job a leaseq 1 worker claimed and is running (lease live)."""
    row = conn.execute(
        f'INSERT INTO "{schema}".job (queue, payload, payload_bytes, status, available_at, '
        "lease_until, lease_seconds, lease_version, attempts, max_attempts, ordering_key, "
        "ordering_seq, claimed_at) VALUES ('work', %s, 10, 'running', now(), "
        "now() + interval '60 s', 60, 1, 1, 1, 'k', %s, now()) RETURNING job_id",
        (psycopg.types.json.Jsonb({"seq": seq}), seq),
    ).fetchone()
    assert row is not None
    return int(row[0])


def _v1_claim(queue: leaseq.Queue, job_id: int, lease_until: datetime) -> leaseq.Claim:
    """The claim the leaseq 1 worker holds for ``job_id`` (its first, lease version 1)."""
    return leaseq.Claim(
        job_id=job_id,
        queue="work",
        payload={},
        lease_version=1,
        attempts=1,
        max_attempts=1,
        key="k",
        seq=None,
        lease_until=lease_until,
        lease_seconds=60.0,
        idempotency_key=str(job_id),
    )


def test_a_v1_database_with_two_running_jobs_of_one_key_upgrades(
    database_url: str, schema: str
) -> None:
    migrate_until(database_url, schema, V1)
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(f"INSERT INTO \"{schema}\".queue (name) VALUES ('work')")  # (its enqueue's)
        # The key's job 2 ran first; job 1, committed late, then ran beside it.
        second = _running_v1_job(conn, schema, seq=2)
        first = _running_v1_job(conn, schema, seq=1)
        third = conn.execute(
            f'INSERT INTO "{schema}".job (queue, payload, payload_bytes, available_at, '
            "max_attempts, ordering_key, ordering_seq) VALUES ('work', '{\"seq\": 3}', 10, "
            "now(), 1, 'k', 3) RETURNING job_id"
        ).fetchone()
        assert third is not None
        lease_until = conn.execute(
            f'SELECT lease_until FROM "{schema}".job WHERE job_id = %s', (first,)
        ).fetchone()

    with leaseq.Queue(database_url, schema=schema) as queue:
        queue.migrate()  # raised UniqueViolation at job_running_key_idx

        with psycopg.connect(database_url) as conn:
            rows = conn.execute(
                f'SELECT job_id, status FROM "{schema}".job ORDER BY ordering_seq'
            ).fetchall()
        # Nothing lost, nothing finished, one running job for the key.
        assert [job_id for job_id, _ in rows] == [first, second, int(third[0])]
        assert [status for _, status in rows].count("running") == 1
        assert all(status in ("queued", "running") for _, status in rows)

        # The key keeps its earliest job running; its old worker may complete it.
        # The other was put back: its old worker's late write is refused.
        assert lease_until is not None
        assert dict(rows)[first] == "running"
        with pytest.raises(leaseq.LeaseLost):
            queue.complete(_v1_claim(queue, second, lease_until[0]))
        queue.complete(_v1_claim(queue, first, lease_until[0]))

        # The rest of the key runs, in order, its one attempt intact.
        ran: list[int] = []
        app = leaseq.App(schema=schema)

        @app.task("work")
        def work(job: leaseq.JobContext) -> None:
            ran.append(job.payload["seq"])

        drain(app, dsn=database_url)
        assert ran == [2, 3]
        for job_id in (first, second, int(third[0])):
            assert queue.get(job_id).status is leaseq.JobStatus.DONE


def test_a_producer_of_leaseq_at_migration_8_keeps_enqueueing_unique_jobs(
    database_url: str, schema: str
) -> None:
    """Migrate first, then deploy: the older producers run on the migrated schema
    meanwhile. Migration 0009 replaced enqueue_unique() by one that also takes a
    group, and the older producers' every unique enqueue failed until deployed."""
    migrate_until(database_url, schema, 8)
    with leaseq.Queue(database_url, schema=schema) as queue:
        queue.migrate()
    # The call leaseq at migration 8 sends (its enqueue_unique.sql): 14 arguments.
    older_call = (
        f'SELECT * FROM "{schema}".enqueue_unique(%s, NULL, %s, 2, 0::smallint, now(), '
        "NULL::integer, NULL, NULL, NULL, NULL, NULL, %s, NULL)"
    )
    with psycopg.connect(database_url, autocommit=True) as conn:
        first = conn.execute(older_call, ("work", "{}", "report-7")).fetchone()
        again = conn.execute(older_call, ("work", "{}", "report-7")).fetchone()
    assert first is not None
    assert again is not None
    assert (again[0], first[1], again[1]) == (first[0], False, True)  # one job for the key
    with leaseq.Queue(database_url, schema=schema) as queue:
        job = queue.get(int(first[0]))
        assert (job.status, job.unique_key) == (leaseq.JobStatus.QUEUED, "report-7")


def _cut_as_leaseq_12_did(
    conn: psycopg.Connection[tuple[object, ...]], schema: str, job_id: int
) -> datetime:
    """cancel(running=True) as leaseq at migration 12 sent it: cancel.sql, then
    its hold on the key's next job of the moment (its available_at moved), in
    one transaction. Returns the cut lease's end."""
    with conn.transaction():
        cut = conn.execute(
            f"UPDATE \"{schema}\".job SET status = 'cancelled', finished_at = now(), "
            "lease_until = NULL, lease_version = lease_version + 1, history = history || "
            "jsonb_build_array(jsonb_build_object('attempt', 1, 'outcome', 'cancelled', "
            "'previous_status', 'running', 'lease_version', 1, 'cut_lease_until', "
            "lease_until)) WHERE job_id = %s RETURNING (history -> -1 ->> 'cut_lease_until')"
            "::timestamptz",
            (job_id,),
        ).fetchone()
        assert cut is not None
        conn.execute(
            f'UPDATE "{schema}".job SET available_at = greatest(available_at, %s) '
            "WHERE ordering_key = 'k' AND status = 'queued' AND NOT blocked",
            (cut[0],),
        )
    return cut[0]  # type: ignore[no-any-return]


@pytest.mark.parametrize("cut", ["before the upgrade", "during the rollout"])
def test_a_key_held_by_a_lease_an_older_leaseq_cut_stays_held(
    database_url: str, schema: str, cut: str
) -> None:
    """A running job of a key cancelled (cancel(running=True)) by leaseq at
    migration 12 may run on until its lease would have ended. Migration 0013
    made that hold the key's, for every head made claimable later, but only
    for the cuts this leaseq's own statements made: after a cut made before
    the upgrade, or by a leaseq at 12 still running after it, the key's next
    head but one became claimable at once, beside the handler still running."""
    migrate_until(database_url, schema, 12)
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(f"INSERT INTO \"{schema}\".queue (name) VALUES ('work')")
        running = _running_v1_job(conn, schema, seq=1)  # lease 60 s
        for seq in (2, 3):
            conn.execute(
                f'INSERT INTO "{schema}".job (queue, payload, payload_bytes, available_at, '
                "max_attempts, ordering_key, ordering_seq) VALUES ('work', '{}', 2, now(), 1, "
                "'k', %s)",
                (seq,),
            )
        if cut == "before the upgrade":
            lease_end = _cut_as_leaseq_12_did(conn, schema, running)
    with leaseq.Queue(database_url, schema=schema) as queue:
        queue.migrate()
        if cut == "during the rollout":
            with psycopg.connect(database_url, autocommit=True) as conn:
                lease_end = _cut_as_leaseq_12_did(conn, schema, running)
        waiting = sorted(queue.list_jobs("queued"), key=lambda j: j.seq or 0)
        second, third = (job.job_id for job in waiting)
        queue.cancel(second)  # the key's third job becomes its head
        assert queue.claim("work", limit=5) == []  # the cut lease has not ended
        assert queue.get(third).available_at >= lease_end


def _cancel_as_leaseq_14_did(
    conn: psycopg.Connection[tuple[object, ...]], schema: str, job_id: int
) -> None:
    """cancel(running=True) as leaseq at migration 14 sent it (cancel.sql): a
    running job's history entry keeps the cut lease's end; a queued job is
    cancelled at once."""
    (changed,) = conn.execute(
        f"UPDATE \"{schema}\".job SET status = 'cancelled', finished_at = now(), "
        "lease_until = NULL, "
        "lease_version = lease_version + CASE WHEN status = 'running' THEN 1 ELSE 0 END, "
        "history = history || jsonb_build_array(jsonb_build_object("
        "'attempt', attempts, 'at', now(), 'outcome', 'cancelled', 'previous_status', status) "
        "|| CASE WHEN status = 'running' THEN jsonb_build_object('lease_version', "
        "lease_version, 'claimed_at', claimed_at, 'cut_lease_until', lease_until) "
        "ELSE '{}'::jsonb END) WHERE job_id = %s RETURNING job_id",
        (job_id,),
    ).fetchall()
    assert changed == (job_id,)


def _release_as_leaseq_14_did(
    conn: psycopg.Connection[tuple[object, ...]], schema: str, job_id: int
) -> None:
    """A release while the handler runs on as leaseq at migration 14 sent it
    (release.sql): queued again once the lease would have ended, its history
    entry without that end."""
    (changed,) = conn.execute(
        f"UPDATE \"{schema}\".job SET status = 'queued', lease_until = NULL, "
        "available_at = greatest(now(), lease_until), "
        "attempts = greatest(attempts - 1, 0), "
        "history = history || jsonb_build_array(jsonb_build_object("
        "'attempt', attempts, 'at', now(), 'outcome', 'released', 'write', 'release', "
        "'lease_version', lease_version, 'claimed_at', claimed_at)) "
        "WHERE job_id = %s AND status = 'running' RETURNING job_id",
        (job_id,),
    ).fetchall()
    assert changed == (job_id,)


@pytest.mark.parametrize("cut", ["cancel", "release", "release, then cancel"])
def test_a_slot_held_by_a_lease_cut_before_migration_15_stays_held(
    database_url: str, schema: str, cut: str
) -> None:
    """0015 holds a concurrency slot while a lease cut short would still run;
    a lease cut before it (a cancel, or a release while the handler ran on)
    held none, and the next job started beside its handler, two at once under
    max_running=1."""
    migrate_until(database_url, schema, 14)
    with leaseq.Queue(database_url, schema=schema) as queue:  # the schema is 14's
        queue.configure_queue("work", max_running=1)
        with psycopg.connect(database_url, autocommit=True) as conn:  # as 14's producers
            (cut_short,), _ = conn.execute(  # (this leaseq's enqueue needs migration 20)
                f'INSERT INTO "{schema}".job (queue, payload, payload_bytes, available_at, '
                "max_attempts) VALUES ('work', '{}', 2, now(), 5), ('work', '{}', 2, now(), 5) "
                "RETURNING job_id"
            ).fetchall()
        (claim,) = queue.claim("work", lease=300)
        assert claim.job_id == cut_short
        # (The cuts as leaseq at 14 wrote them: this leaseq's cancel and release
        # write the slot_hold table of 0015 themselves.)
        with psycopg.connect(database_url, autocommit=True) as conn:
            if cut == "cancel":
                _cancel_as_leaseq_14_did(conn, schema, cut_short)
            else:
                _release_as_leaseq_14_did(conn, schema, cut_short)
            if cut == "release, then cancel":
                _cancel_as_leaseq_14_did(conn, schema, cut_short)  # queued: at once
        queue.migrate()
        held = queue.claim("work", limit=5)
        assert (list(held), held.held_back) == ([], True)


def test_a_schema_migrated_with_the_first_text_of_0007_gets_its_columns(
    database_url: str, schema: str
) -> None:
    """0007 was edited after it shipped (result_awaited added): a schema migrated
    with its first text recorded 0007 and never got the columns, and every
    completion failed there, `leaseq migrate` finding nothing to do."""
    migrate_until(database_url, schema, 13)
    with psycopg.connect(database_url, autocommit=True) as conn:
        for table in ("job", "job_archive"):
            conn.execute(f'ALTER TABLE "{schema}".{table} DROP COLUMN result_awaited')
    with leaseq.Queue(database_url, schema=schema) as queue:
        queue.migrate()
        job_id = queue.enqueue("work", {})
        (claim,) = queue.claim("work")
        queue.complete(claim, result=7)
        assert queue.result(job_id) == 7


@pytest.mark.parametrize("in_use", [True, False])
def test_enqueues_on_a_schema_in_use_before_migration_20_notify_for_a_day(
    database_url: str, schema: str, in_use: bool
) -> None:
    """Workers before 0020 wait for notifications without saying so: while a
    rolling upgrade may still run them, every enqueue of a queue in use
    notifies, as before. A schema with no queue yet has no such workers."""
    migrate_until(database_url, schema, 19)
    if in_use:
        with psycopg.connect(database_url, autocommit=True) as conn:
            conn.execute(f"INSERT INTO \"{schema}\".queue (name) VALUES ('work')")
    with (
        leaseq.Queue(database_url, schema=schema) as queue,
        psycopg.connect(database_url, autocommit=True) as listener,
    ):
        queue.migrate()
        listener.execute(f'LISTEN "{queue._store.channel}"')
        queue.enqueue("work", {})
        heard = [n.payload for n in listener.notifies(timeout=0.5, stop_after=1)]
        assert heard == (["work"] if in_use else [])
        if in_use:  # a day later the reaper's round ends it
            with psycopg.connect(database_url, autocommit=True) as conn:
                conn.execute(  # (its entry's expiry, moved a day and a second back)
                    f'UPDATE "{schema}".queue SET waiting = (SELECT jsonb_object_agg(key, '
                    "value::double precision - 86401) FROM jsonb_each(waiting))"
                )
            queue.reap()
            queue.enqueue("work", {})
            assert [n.payload for n in listener.notifies(timeout=0.5, stop_after=1)] == []
