"""leaseq in Django: enqueue in ``transaction.atomic()``, handlers whose effect and
completion commit together, ``manage.py leaseq_worker`` / ``leaseq_migrate``, and a
backend for Django's task framework (:mod:`leaseq.contrib.django.tasks`).

Add ``"leaseq.contrib.django"`` to ``INSTALLED_APPS``; settings in ``settings.LEASEQ``
(:mod:`leaseq.contrib.django.conf`). See docs/django.md.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime
from typing import Any

import psycopg
from django.core.signals import setting_changed
from django.db import connections, transaction
from psycopg import pq

from leaseq import App, InvalidArgument, JobContext, JobId, JobIds, Queue

from .conf import LeaseqSettings, leaseq_settings

__all__ = [
    "LeaseqSettings",
    "close_queues",
    "connection",
    "enqueue",
    "enqueue_many",
    "job_atomic",
    "leaseq_settings",
    "queue",
    "worker_app",
]

_lock = threading.Lock()
_queues: dict[tuple[str, str], Queue] = {}


def queue(using: str | None = None) -> Queue:
    """The process' :class:`leaseq.Queue` on ``LEASEQ``'s schema, on
    ``LEASEQ["DATABASE_URL"]``, else on the database of the alias ``using``
    (default ``LEASEQ["DATABASE"]``). One per DSN and schema, its pool opened on
    first use; closed and forgotten when ``LEASEQ`` or ``DATABASES`` change (as in
    ``override_settings``)."""
    config = leaseq_settings()
    key = (config.dsn(using), config.schema)
    with _lock:
        found = _queues.get(key)
        if found is None:
            found = _queues[key] = Queue(key[0], schema=key[1])
        return found


def close_queues() -> None:
    """Close the pools of :func:`queue` (they open again on the next use)."""
    with _lock:
        opened = list(_queues.values())
        _queues.clear()
    for each in opened:
        each.close()


def _settings_changed(*, setting: str, **kwargs: Any) -> None:
    if setting in {"LEASEQ", "DATABASES"}:
        close_queues()


setting_changed.connect(_settings_changed, dispatch_uid="leaseq.contrib.django.settings")


def connection(using: str | None = None) -> psycopg.Connection[Any]:
    """The psycopg connection under Django's connection ``using`` (default:
    ``LEASEQ["DATABASE"]``), for leaseq's ``conn=``: what runs on it joins
    Django's transaction.

    Inside ``atomic()`` the transaction is made to begin now if nothing has run
    in it yet: psycopg would otherwise treat a block of leaseq's as a
    transaction of its own, and commit it at once.
    """
    alias = using or leaseq_settings().database
    wrapper = connections[alias]
    # As Django's own cursor() does: a persistent connection (CONN_MAX_AGE) is
    # health-checked at its first use of a request or job (CONN_HEALTH_CHECKS),
    # and replaced if the server dropped it.
    wrapper.close_if_health_check_failed()
    wrapper.ensure_connection()
    raw = wrapper.connection
    if not isinstance(raw, psycopg.Connection):
        raise InvalidArgument(
            f"DATABASES[{alias!r}] does not run on psycopg 3 (install psycopg, not psycopg2)"
        )
    if wrapper.in_atomic_block and raw.info.transaction_status == pq.TransactionStatus.IDLE:
        # A savepoint opens the transaction the way Django itself does (BEGIN is
        # implicit before the first statement on a non-autocommit connection).
        # savepoint_create() from Django 6.1 (savepoint() is deprecated there).
        create = getattr(transaction, "savepoint_create", transaction.savepoint)
        savepoint = create(using=alias)
        transaction.savepoint_commit(savepoint, using=alias)
    return raw


@contextmanager
def _refusals_roll_back(using: str | None) -> Iterator[psycopg.Connection[Any]]:
    """Django's connection ``using`` for a write of leaseq's; a refusal from the
    database (BacklogFull, a queue's PayloadTooLarge) inside ``atomic()`` marks
    the block for rollback, as Django's own writes do. leaseq writes on the
    psycopg connection under Django's, so Django did not know the transaction
    had failed: a caller who caught the refusal left the block normally, the
    server turned its COMMIT into a ROLLBACK (the business rows gone), and its
    ``on_commit`` callbacks ran all the same. A refusal before anything was sent
    (a bad payload) leaves the transaction, and the block, as they were. A
    connection the failure broke is flagged for Django, as its own errors are."""
    conn = connection(using)
    try:
        yield conn
    except BaseException:
        alias = using or leaseq_settings().database
        if conn.broken or conn.closed:
            # Django's own failed queries say so: close_old_connections() then
            # replaces the connection at the next request (or job) instead of
            # keeping a dead one, which every later enqueue failed on, for good.
            connections[alias].errors_occurred = True
        if (
            connections[alias].in_atomic_block
            and conn.info.transaction_status == pq.TransactionStatus.INERROR
        ):
            transaction.set_rollback(True, using=alias)
        raise


@contextmanager
def reading_in_atomic(using: str | None = None) -> Iterator[psycopg.Connection[Any] | None]:
    """Django's connection ``using`` for a read of leaseq's inside ``atomic()``
    (a job enqueued in the block is seen there, as the block's ORM reads see its
    rows; a read on leaseq's pool would not see it before the block commits);
    None outside one (the pool's connection reads what is committed, the same).
    A read the database refused marks the block for rollback, as a write."""
    alias = using or leaseq_settings().database
    if not connections[alias].in_atomic_block:
        yield None
        return
    with _refusals_roll_back(alias) as conn:
        yield conn


def enqueue(
    queue_name: str,
    payload: Any,
    *,
    using: str | None = None,
    delay: float | None = None,
    run_at: datetime | None = None,
    priority: int = 0,
    max_attempts: int | None = None,
    key: str | None = None,
    seq: int | None = None,
    idempotency_key: str | None = None,
    timeout: float | None = None,
    unique_key: str | None = None,
    unique_for: float | None = None,
    group: str | None = None,
) -> JobId:
    """Enqueue one job on Django's connection ``using``: inside ``transaction.atomic()``
    it commits or rolls back with the block (no ``on_commit`` needed); outside
    one, at once (Django's autocommit). The arguments are ``leaseq.Queue.enqueue``'s."""
    with _refusals_roll_back(using) as conn:
        return queue(using).enqueue(
            queue_name,
            payload,
            conn=conn,
            delay=delay,
            run_at=run_at,
            priority=priority,
            max_attempts=max_attempts,
            key=key,
            seq=seq,
            idempotency_key=idempotency_key,
            timeout=timeout,
            unique_key=unique_key,
            unique_for=unique_for,
            group=group,
        )


def enqueue_many(
    queue_name: str,
    payloads: Iterable[Any],
    *,
    using: str | None = None,
    delay: float | None = None,
    run_at: datetime | None = None,
    priority: int = 0,
    max_attempts: int | None = None,
    key: str | None = None,
    seqs: Sequence[int] | None = None,
    timeout: float | None = None,
    unique_keys: Sequence[str] | None = None,
    unique_for: float | None = None,
    group: str | None = None,
) -> JobIds:
    """Enqueue many jobs of one queue in one statement, on Django's connection
    ``using`` (in its transaction, as :func:`enqueue`). The arguments are
    ``leaseq.Queue.enqueue_many``'s."""
    with _refusals_roll_back(using) as conn:
        return queue(using).enqueue_many(
            queue_name,
            payloads,
            conn=conn,
            delay=delay,
            run_at=run_at,
            priority=priority,
            max_attempts=max_attempts,
            key=key,
            seqs=seqs,
            timeout=timeout,
            unique_keys=unique_keys,
            unique_for=unique_for,
            group=group,
        )


@contextmanager
def job_atomic(job: JobContext, using: str | None = None) -> Iterator[None]:
    """A ``transaction.atomic()`` block for a handler's effect that also completes
    the job: the fenced completion runs last inside it, so the effect and the
    completion commit together, or neither does.

    If the attempt lost its lease, the completion raises ``leaseq.LeaseLost`` and
    the block's writes roll back (the job runs again elsewhere: its effect happens
    once). Set ``job.result`` inside the block to store a result. The block is
    durable: it cannot be nested in another ``atomic()``, whose rollback would undo
    a completion already reported.
    """
    alias = using or leaseq_settings().database
    with job._completing_block():
        _refuse_manual_commits(alias)
        try:
            with transaction.atomic(using=alias, durable=True):
                # Before the effect (REPEATABLE READ, SERIALIZABLE): a renewal of
                # the lease during the block would fail the completion.
                job._hold_in(connection(alias))
                yield
                _refuse_rollback_only(alias)
                job.completing = True  # the fence decides from here (JobContext)
                job.complete_in(connection(alias))
        finally:
            job.completing = False
    job.mark_completed()


def _refuse_manual_commits(alias: str) -> None:
    """With ``AUTOCOMMIT: False`` in DATABASES the application commits itself, and
    Django's outermost ``atomic()`` is a mere savepoint: the block would commit
    nothing, and the job be reported completed while its effect and completion
    waited in a transaction that closing the connection rolls back (the worker
    then stopped renewing a job still running, ran its on_success hooks, and
    every later attempt went the same way). Refused before anything is written.
    (An ``atomic()`` around the block is the durability check's to refuse.)"""
    wrapper = connections[alias]
    if not wrapper.in_atomic_block and not wrapper.get_autocommit():
        raise InvalidArgument(
            f"job_atomic needs DATABASES[{alias!r}] in autocommit (AUTOCOMMIT: True, "
            "Django's default): without it the block's atomic() commits nothing, and "
            "the job's completion would not commit with its effect"
        )


def _refuse_rollback_only(alias: str) -> None:
    """A block Django will roll back at its exit, without raising: marked with
    ``transaction.set_rollback(True)``, or by an error of the ORM caught inside it
    without a savepoint of its own. The completion, sent on the psycopg connection
    under Django's, would roll back with the effect while the job was reported
    completed (the worker then stops renewing a job still running): raised instead,
    inside the block, so that neither commits and the attempt ends with this error."""
    if transaction.get_rollback(using=alias):
        cause = getattr(connections[alias], "rollback_exc", None)
        raise InvalidArgument(
            "the job_atomic block is marked for rollback (transaction.set_rollback(True), "
            "or an error caught inside it without a savepoint): neither its effect nor "
            "the job's completion commits"
        ) from cause


def worker_app(queues: Iterable[str] | None = None) -> App:
    """The :class:`leaseq.App` ``manage.py leaseq_worker`` runs; see
    :func:`leaseq.contrib.django.worker.worker_app`."""
    from .worker import worker_app as build  # noqa: PLC0415 - needs the app registry

    return build(queues)
