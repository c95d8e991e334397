"""Enqueue wakes idle workers with a NOTIFY on the schema's channel (a hint only;
sent while a worker waits for one: tests/test_wake_entries.py)."""

from __future__ import annotations

from typing import Any

import psycopg

import leaseq
from leaseq._statement import notify_channel


def _notifications(conn: psycopg.Connection[Any]) -> list[str]:
    return [n.payload for n in conn.notifies(timeout=0.5, stop_after=10)]


def _a_worker_waits_on(queue: leaseq.Queue, connect: Any, *names: str) -> None:
    """As an idle worker says so (migration 0020): only then do enqueues notify."""
    conn = connect(autocommit=True)
    for name in names:
        conn.execute(
            f'INSERT INTO "{queue.schema}".queue (name, waiting) VALUES (%s, %s::jsonb)',
            (name, '{"a test worker": 1e10}'),
        )


def test_enqueue_notifies_the_schema_channel_on_commit(queue: leaseq.Queue, connect: Any) -> None:
    _a_worker_waits_on(queue, connect, "reports", "emails")
    listener = connect(autocommit=True)
    listener.execute(f'LISTEN "{queue._store.channel}"')
    producer = connect()
    with producer.transaction():
        queue.enqueue("reports", {}, conn=producer)
        queue.enqueue("reports", {}, conn=producer)  # folded into one by PostgreSQL
        queue.enqueue_many("emails", [{}, {}], conn=producer)
    assert sorted(_notifications(listener)) == ["emails", "reports"]
    with producer.transaction(force_rollback=True):
        queue.enqueue("reports", {}, conn=producer)
    assert _notifications(listener) == []  # a rolled-back job wakes nobody


def test_notify_can_be_turned_off(database_url: str, schema: str, connect: Any) -> None:
    with leaseq.Queue(database_url, schema=schema, notify=False) as queue:
        queue.migrate()
        _a_worker_waits_on(queue, connect, "reports")
        listener = connect(autocommit=True)
        listener.execute(f'LISTEN "{queue._store.channel}"')
        queue.enqueue("reports", {})
        assert _notifications(listener) == []


def test_channel_names_fit_and_stay_distinct() -> None:
    long_a, long_b = "a" * 60 + "_x", "a" * 60 + "_y"
    channels = {notify_channel(s) for s in ("leaseq", long_a, long_b, "a" * 63)}
    assert len(channels) == 4
    assert all(len(c.encode()) <= 63 for c in channels)
    assert notify_channel("leaseq") == "leaseq_leaseq"


def test_no_schema_hears_another_schemas_results_on_its_work_channel() -> None:
    # Schema "results_x"'s workers must not be woken by schema "x"'s finished
    # jobs (nor a waiter of "x" by enqueues into "results_x").
    names = ["x", "results_x", "results_results_x", "leaseq", "a" * 63, "results_" + "a" * 55]
    work = {notify_channel(s) for s in names}
    results = {notify_channel(s, "results") for s in names}
    assert len(work) == len(results) == len(names)
    assert work.isdisjoint(results)
    assert all(len(c.encode()) <= 63 for c in work | results)
