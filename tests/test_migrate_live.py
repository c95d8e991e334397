"""Migrating a schema in use: `leaseq migrate` runs while the workers and the
producers of the older version go on (README "Upgrading")."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import psycopg
import pytest

import leaseq
from leaseq._migrate import latest_version

from .older_schemas import migrate_until

# Its migrations wait for locks with a statement's snapshot held, which holds back
# VACUUM database-wide (see test_plans); and other tests' migrations run the
# same DDL on schemas of their own, so a session is found by its schema too.
pytestmark = pytest.mark.xdist_group("cleanup_horizon")

#: The last migration before one that needs the job table's strongest lock (0017
#: adds a column to it), and after one that replaces a function (0016:
#: claim_limited), all in the one transaction of a migration from 15.
BEFORE_TABLE_CHANGE = 16


def _in_thread(target: Callable[[], Any]) -> tuple[threading.Thread, list[Any]]:
    """``target`` run in a thread of its own; its result (or error) in the list."""
    outcome: list[Any] = []

    def run() -> None:
        try:
            outcome.append(target())
        except BaseException as exc:
            outcome.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, outcome


#: The sessions waiting for a lock of one schema's job table (the statement's text
#: does not say which: pg_stat_activity keeps its first kilobyte, comments).
_WAITING_FOR_THE_JOB_TABLE = (
    "SELECT count(pid) FROM pg_locks JOIN pg_stat_activity USING (pid)"
    " WHERE NOT granted AND relation = %s::regclass"
)


def _wait_for_lock_wait(database_url: str, schema: str, text: str) -> None:
    """Until a session whose statement holds ``text`` waits for the lock of
    ``schema``'s job table (bounded)."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        for _ in range(300):
            row = conn.execute(
                _WAITING_FOR_THE_JOB_TABLE + " AND query LIKE %s",
                (f'"{schema}".job', f"%{text}%"),
            ).fetchone()
            if row is not None and row[0] > 0:
                return
            conn.execute("SELECT pg_sleep(0.05)")
    raise AssertionError(f"no session waited for a lock in {text!r}")


def test_a_migration_waiting_behind_a_long_transaction_never_holds_up_the_queue(
    database_url: str, schema: str
) -> None:
    """A migration that must lock the job table waits for every transaction that
    uses it; queued behind one that stays open (a producer's long transaction, a
    report), it held up every later statement on the table, each claim and
    enqueue of every worker and producer, for as long as that transaction
    lasted. The queue must go on while the migration waits, and the migration
    must finish once that transaction has ended."""
    migrate_until(database_url, schema, BEFORE_TABLE_CHANGE)
    # (The schema is at 16 until the migration commits: this code's statements need
    # the latest, so the producers and workers of that time are raw statements
    # that take the same table locks: a write, a locking read.)
    insert = (
        f'INSERT INTO "{schema}".job (queue, payload, payload_bytes, available_at, max_attempts)'
        " VALUES ('mail', %s, 8, now(), 3)"
    )
    with psycopg.connect(database_url, autocommit=True) as producer:
        producer.execute(insert, ('{"n": 1}',))
    with psycopg.connect(database_url) as long_transaction:
        # Should the queue be held up regardless, the server ends this session
        # after 20 s, so that the test fails instead of hanging.
        long_transaction.execute("SET idle_in_transaction_session_timeout = '20s'")
        long_transaction.execute(f'SELECT count(*) FROM "{schema}".job')  # holds its lock
        with leaseq.Queue(database_url, schema=schema) as operator:
            migrating, migrated = _in_thread(operator.migrate)
            _wait_for_lock_wait(database_url, schema, "deferred")

            def work() -> list[int]:
                with psycopg.connect(database_url, autocommit=True) as worker:
                    worker.execute(insert, ('{"n": 2}',))
                    claimed = worker.execute(
                        f"SELECT (payload ->> 'n')::int FROM \"{schema}\".job"
                        " FOR UPDATE SKIP LOCKED"
                    ).fetchall()
                    return sorted(n for (n,) in claimed)

            working, worked = _in_thread(work)
            working.join(timeout=60)
            assert worked == [[1, 2]], worked
            # The queue went on while the long transaction was still open.
            assert long_transaction.execute("SELECT 1").fetchone() == (1,)
            assert migrating.is_alive(), migrated  # (it waits for that transaction)
            long_transaction.rollback()
            migrating.join(timeout=60)
            assert migrated == [list(range(BEFORE_TABLE_CHANGE + 1, latest_version() + 1))]


def test_a_migration_whose_connection_is_killed_midway_leaves_the_schema_as_it_was(
    database_url: str, schema: str
) -> None:
    """Ended midway (pg_terminate_backend, a failover) after it had replaced a
    function (0016) and while it waited for the job table (0017): nothing of it
    stays, the schema is the older one still, and a re-run applies it all."""

    def claim_limited() -> object:
        with psycopg.connect(database_url, autocommit=True) as conn:
            return conn.execute(
                "SELECT md5(prosrc) FROM pg_proc"
                " WHERE proname = 'claim_limited' AND pronamespace = %s::regnamespace",
                (schema,),
            ).fetchone()

    migrate_until(database_url, schema, BEFORE_TABLE_CHANGE - 1)
    before = claim_limited()
    with psycopg.connect(database_url) as long_transaction:
        long_transaction.execute("SET idle_in_transaction_session_timeout = '20s'")
        long_transaction.execute(f'SELECT count(*) FROM "{schema}".job')
        with leaseq.Queue(database_url, schema=schema) as operator:
            migrating, migrated = _in_thread(operator.migrate)
            with psycopg.connect(database_url, autocommit=True) as conn:
                for _ in range(600):  # (it waits a while at a time, bounded)
                    ended = conn.execute(
                        _WAITING_FOR_THE_JOB_TABLE.replace(
                            "count(pid)", "pg_terminate_backend(pid)"
                        ),
                        (f'"{schema}".job',),
                    ).fetchall()
                    if ended:
                        break
                    conn.execute("SELECT pg_sleep(0.02)")
            migrating.join(timeout=60)
        long_transaction.rollback()
    assert ended == [(True,)]
    assert len(migrated) == 1
    assert isinstance(migrated[0], leaseq.TransientError), migrated
    assert claim_limited() == before
    with psycopg.connect(database_url, autocommit=True) as conn:
        versions = conn.execute(f'SELECT max(version) FROM "{schema}".migration').fetchone()
    assert versions == (BEFORE_TABLE_CHANGE - 1,)
    with leaseq.Queue(database_url, schema=schema) as operator:
        assert operator.migrate() == list(range(BEFORE_TABLE_CHANGE, latest_version() + 1))
    assert claim_limited() != before
