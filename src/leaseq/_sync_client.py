"""The producer and worker API for synchronous code.

GENERATED from ``_async_client.py`` by ``tools/async_to_sync.py``: do not edit
this file; edit the async source and run the tool (``make lint`` checks it).
See ``_async_client.py`` for what it does.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime
from types import TracebackType
from typing import Any, Self, TypeVar

from . import _metrics, _migrate, _steps, _tracing
from . import _validate as validate
from ._client_base import ClientBase, pool_options
from ._db import (
    Connection,
    Database,
    LockWaitOver,
)
from ._job_ids import JobId, JobIds
from ._logs import get_logger
from ._metrics import Metrics
from ._statement import Operation
from ._sync_operators import OperatorCalls
from ._types import (
    Claim,
    Claims,
    JobStatus,
    RenewalBusy,
)

# Connection is the type of ``conn=`` and of ``connection()``: exported with it.
__all__ = ["Connection", "Queue"]

log = get_logger("leaseq")

T = TypeVar("T")


class Queue(OperatorCalls, ClientBase):
    """A leaseq schema (its many named queues) on one database.

    Opens a small pool of autocommit connections on first use; close it with
    ``close()`` or by using the queue as a context manager. Enqueues are counted
    on ``metrics`` (``leaseq.metrics`` unless given; None counts nothing). With
    ``statement_timeout`` (seconds, > 0; None: no timeout), the server cancels
    any of its statements that runs longer (StatementTimeout), as a dashboard
    wants for its reads. ``wait_result`` hears jobs end on a LISTEN connection of
    its own; ``listen=False`` (behind PgBouncer's transaction pooling, where a
    LISTEN stays on a server connection of the pool) makes it poll instead. Bad
    options raise InvalidArgument here, before anything connects.
    The operators' calls (replay, cancel, stats, find_jobs, ...) are those of
    :class:`~leaseq._sync_operators.OperatorCalls`.
    """

    def __init__(
        self,
        dsn: str | None = None,
        *,
        schema: str = "leaseq",
        max_payload_bytes: int | None = None,
        pool_size: int = 10,
        notify: bool = True,
        connection_options: dict[str, Any] | None = None,
        connect_timeout: float = 30.0,
        metrics: Metrics | None = _metrics.DEFAULT,
        statement_timeout: float | None = None,
        listen: bool = True,
    ) -> None:
        validate.flag(listen, "listen")
        options = pool_options(
            pool_size=pool_size,
            connection_options=connection_options,
            connect_timeout=connect_timeout,
            statement_timeout=statement_timeout,
        )
        super().__init__(
            dsn, schema=schema, max_payload_bytes=max_payload_bytes, notify=notify, metrics=metrics
        )
        self._db = Database(
            self.dsn,
            max_size=pool_size,
            options=options,
            open_timeout=connect_timeout,
            listen=listen,
        )

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        """Close the connection pool (it opens again on the next use)."""
        self._db.close()

    @contextmanager
    def connection(self) -> Iterator[Connection]:
        """A connection of the queue's pool, for your own SQL (autocommit: open a
        transaction with ``conn.transaction()``); back in the pool afterwards, with
        what your SQL set for its session (SET, LISTEN, advisory locks) undone."""
        with self._db.connection(self._store.reset_session()) as conn:
            yield conn

    def migrate(self) -> list[int]:
        """Create or upgrade the schema; returns the migration versions applied now.
        Safe to run concurrently (an advisory lock serialises it), and beside
        running workers and producers: no statement of theirs waits behind the
        migration's lock waits longer than a few seconds (_migrate.lock_waits)."""
        for attempt, (lock_wait, pause) in enumerate(_migrate.lock_waits(), start=1):
            try:
                return self._db.drive(_migrate.plan(self._store, lock_wait))
            except LockWaitOver as exc:
                log.warning(
                    "migrate: schema %s: attempt %d waited %gs for a lock (%s); "
                    "a transaction holds one of its tables: trying again in %.1fs",
                    self.schema,
                    attempt,
                    lock_wait,
                    exc,
                    pause,
                )
                time.sleep(pause)
        raise AssertionError("unreachable: lock_waits() is endless")

    def _require_migrated(self) -> None:
        """NotMigrated unless the schema has every migration of this code (a
        worker's first step: _migrate.require_current)."""
        applied = self._db.run(self._store.migrations_applied())
        _migrate.require_current(self.schema, applied)

    # -- producers -------------------------------------------------------------

    def enqueue(
        self,
        queue: str,
        payload: Any,
        *,
        conn: Connection | None = None,
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
        """Enqueue one job; returns its id. With ``conn``, in your transaction.

        ``key``/``seq`` order it within its ordering key; ``idempotency_key`` is
        the business key handlers see (default: the job's identity); ``timeout``
        overrides its task's. With ``unique_key``, while a job of the queue with
        that key is unfinished (or done less than ``unique_for`` seconds ago),
        nothing is inserted and that job's id comes back (``.existing`` is True).
        ``group`` (a tenant, a customer) is what the queue's per-group limits
        count and what its claims take turns between.
        """
        return self._send(
            queue,
            conn,
            lambda trace_context: self._store.enqueue(
                queue,
                payload,
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
                trace_context=trace_context,
            ),
            lambda job_id: [] if job_id.existing else [job_id],
        )

    def enqueue_many(
        self,
        queue: str,
        payloads: Iterable[Any],
        *,
        conn: Connection | None = None,
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
        """Enqueue many jobs of one queue in one statement; returns their ids in
        input order. All or nothing. With ``conn``, in your transaction. With
        ``unique_keys`` (one per payload), a payload whose key a job of the queue
        holds (an earlier one of the batch included) inserts nothing: its
        position carries that job's id, and ``.existing`` says which did.
        ``group``: the group of every job of the call."""
        return self._send(
            queue,
            conn,
            lambda trace_context: self._store.enqueue_many(
                queue,
                payloads,
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
                trace_context=trace_context,
            ),
            lambda job_ids: job_ids.inserted,
        )

    def _send(
        self,
        queue: str,
        conn: Connection | None,
        build: Callable[[dict[str, str] | None], Operation[T]],
        ids: Callable[[T], list[int]],
    ) -> T:
        """An enqueue call: in its `send` span (whose context the jobs store), into a
        queue whose settings row exists, counted once it succeeded."""
        with _tracing.send(queue) as send:
            steps = _steps.enqueue(self._store, self._known_queues, queue, build(send.context))
            result = self._db.run_steps(steps, conn)
            send.sent(ids(result))
        self._count_enqueued(queue, len(ids(result)))
        return result

    # -- workers: claim, then fenced writes --------------------------------------

    def claim(self, queue: str, *, limit: int = 1, lease: float | None = None) -> Claims:
        """Claim up to ``limit`` jobs of ``queue`` in claim order: expired leases
        first (recovery), then by priority (higher first), age and id; in a queue
        with groups, the groups take turns. ``lease`` defaults to the queue's.
        Committed at once: work outside any transaction. The queue's limits hold
        (``configure_queue(max_running=..., rate_limit=...)``): ``held_back`` on
        the result says when one of them held the claim back."""
        steps = _steps.claim(self._store, queue, limit=limit, lease=lease)
        return self._db.run_steps(steps)

    def complete(self, claim: Claim, *, result: Any = None, conn: Connection | None = None) -> None:
        """Complete a claim, or raise LeaseLost. ``result`` (JSON, at most 64 KiB) is
        stored with the completion, for ``result()`` and ``wait_result()``.

        With ``conn`` (your transaction, where an effect commits with the
        completion) a job this claim already completed raises AlreadyCompleted,
        so a re-run of the transaction rolls its effect back. Without it a
        resend after an ambiguous commit is accepted.
        """
        steps = _steps.complete(self._store, claim, result=result, strict=conn is not None)
        self._db.run_steps(steps, conn)

    def _hold_for_completion(self, claim: Claim, conn: Connection) -> None:
        """First in the caller's transaction (``conn``) that will complete ``claim``
        (JobContext's blocks of leaseq.contrib): in REPEATABLE READ or SERIALIZABLE
        the job's row is locked now, fenced (LeaseLost), so that the worker's
        renewals cannot make the completion a serialization failure."""
        self._db.run(self._store.hold_for_completion(claim), conn)

    def complete_many(
        self,
        claims: Sequence[Claim],
        *,
        results: Sequence[Any] | None = None,
        conn: Connection | None = None,
    ) -> list[tuple[Claim, bool]]:
        """Per claim, True if completed; with ``conn``, an earlier completion is False.
        ``results``: one per claim (None for none), stored with the completions."""
        return self._db.run(
            self._store.complete(claims, results=results, strict=conn is not None), conn
        )

    def renew(self, claim: Claim, *, lease: float | None = None) -> datetime:
        """Extend the lease: its new end, or LeaseLost. Waits while another transaction
        holds the job's row locked, so the answer is definite."""
        return self._db.run(self._store.renew_one(claim, lease))

    def renew_many(
        self, claims: Sequence[Claim], *, lease: float | None = None
    ) -> list[tuple[Claim, datetime | RenewalBusy | None]]:
        """Per claim: the new lease end; RENEWAL_BUSY (row locked by another transaction
        right now, lease still live and unchanged: renew again soon); None if lost.
        Never waits for a locked row, so one cannot delay the others' renewal."""
        return self._db.run(self._store.renew(claims, lease))

    def retry(
        self,
        claim: Claim,
        *,
        delay: float | None = None,
        error: object = None,
        conn: Connection | None = None,
    ) -> JobStatus:
        """Give the job back for another attempt (after ``delay``, else the queue's
        backoff): QUEUED, or FAILED when its attempts are used up. LeaseLost if this
        claim no longer owns it; with ``conn``, also if its retry already committed."""
        operation = self._store.retry_one(claim, delay=delay, error=error, strict=conn is not None)
        return self._db.run(operation, conn)

    def fail(self, claim: Claim, error: object = None, *, conn: Connection | None = None) -> None:
        """Fail the job for good (kept, replayable), or raise LeaseLost; with ``conn``,
        also if its fail already committed."""
        self._db.run(self._store.fail_one(claim, error, strict=conn is not None), conn)

    def retry_many(
        self,
        claims: Sequence[Claim],
        *,
        delays: Sequence[float | None] | None = None,
        errors: Sequence[object] | None = None,
    ) -> list[tuple[Claim, JobStatus | None]]:
        """Per claim: the job's new status (QUEUED, or FAILED when exhausted); None if
        lost. A resend of this claim's committed retry answers what it did."""
        return self._db.run(self._store.retry(claims, delays=delays, errors=errors))

    def fail_many(
        self, claims: Sequence[Claim], errors: Sequence[object] | None = None
    ) -> list[tuple[Claim, bool]]:
        """Per claim: True if failed (now, or by this claim's committed fail)."""
        return self._db.run(self._store.fail(claims, errors))

    def release_many(
        self, claims: Sequence[Claim], *, handlers_running: Sequence[bool] | None = None
    ) -> list[tuple[Claim, bool]]:
        """Give unfinished claims back at once, without counting the attempt. A claim
        whose handler still runs (``handlers_running[i]``: a thread that cannot be
        stopped) may run again only once its lease would have ended."""
        return self._db.run(self._store.release(claims, handlers_running=handlers_running))
