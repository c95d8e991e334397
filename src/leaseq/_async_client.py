"""The producer and operator API for asyncio code: :class:`AsyncQueue`.

This file is the source of the sync client too: ``tools/async_to_sync.py``
writes ``_sync_client.py`` (``Queue``) from it, leaving out the blocks marked
async-only (and the imports only they use), and ``make lint`` checks that the
two agree, so edit this one only. Every method asks the
:class:`~leaseq._store.Store` for its operation (or the ``_steps`` for a call
of several operations) and hands it to the database layer to run.

Pass ``conn=`` (your own psycopg connection) to run an operation inside your
transaction: an enqueue then commits or rolls back with your business rows,
and a completion commits together with a handler's effect.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from datetime import datetime
from types import TracebackType
from typing import Any, Self, TypeVar

from . import _metrics, _migrate, _steps, _tracing
from . import _validate as validate
from ._async_operators import AsyncOperatorCalls
from ._client_base import ClientBase, pool_options
from ._db import (
    ASYNC_ACKNOWLEDGEMENT_OPTIONS,
    SERVICE_OPTIONS,
    WORKER_OPTIONS,
    AsyncConnection,
    AsyncDatabase,
    LockWaitOver,
    Session,
)
from ._job_ids import JobId, JobIds
from ._logs import get_logger
from ._metrics import Metrics
from ._statement import Operation
from ._types import (
    Claim,
    Claims,
    JobStatus,
    RenewalBusy,
)

# AsyncConnection is the type of ``conn=`` and of ``connection()``: exported with it.
__all__ = ["AsyncConnection", "AsyncQueue"]

log = get_logger("leaseq")

T = TypeVar("T")


class AsyncQueue(AsyncOperatorCalls, ClientBase):
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
    :class:`~leaseq._async_operators.AsyncOperatorCalls`.
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
        self._db = AsyncDatabase(
            self.dsn,
            max_size=pool_size,
            options=options,
            open_timeout=connect_timeout,
            listen=listen,
        )

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def close(self) -> None:
        """Close the connection pool (it opens again on the next use)."""
        await self._db.close()

    @asynccontextmanager
    async def connection(self) -> AsyncIterator[AsyncConnection]:
        """A connection of the queue's pool, for your own SQL (autocommit: open a
        transaction with ``conn.transaction()``); back in the pool afterwards, with
        what your SQL set for its session (SET, LISTEN, advisory locks) undone."""
        async with self._db.connection(self._store.reset_session()) as conn:
            yield conn

    async def migrate(self) -> list[int]:
        """Create or upgrade the schema; returns the migration versions applied now.
        Safe to run concurrently (an advisory lock serialises it), and beside
        running workers and producers: no statement of theirs waits behind the
        migration's lock waits longer than a few seconds (_migrate.lock_waits)."""
        for attempt, (lock_wait, pause) in enumerate(_migrate.lock_waits(), start=1):
            try:
                return await self._db.drive(_migrate.plan(self._store, lock_wait))
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
                await asyncio.sleep(pause)
        raise AssertionError("unreachable: lock_waits() is endless")

    async def _require_migrated(self) -> None:
        """NotMigrated unless the schema has every migration of this code (a
        worker's first step: _migrate.require_current)."""
        applied = await self._db.run(self._store.migrations_applied())
        _migrate.require_current(self.schema, applied)

    # -- producers -------------------------------------------------------------

    async def enqueue(
        self,
        queue: str,
        payload: Any,
        *,
        conn: AsyncConnection | None = None,
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
        return await self._send(
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

    async def enqueue_many(
        self,
        queue: str,
        payloads: Iterable[Any],
        *,
        conn: AsyncConnection | None = None,
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
        return await self._send(
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

    async def _send(
        self,
        queue: str,
        conn: AsyncConnection | None,
        build: Callable[[dict[str, str] | None], Operation[T]],
        ids: Callable[[T], list[int]],
    ) -> T:
        """An enqueue call: in its `send` span (whose context the jobs store), into a
        queue whose settings row exists, counted once it succeeded."""
        with _tracing.send(queue) as send:
            steps = _steps.enqueue(self._store, self._known_queues, queue, build(send.context))
            result = await self._db.run_steps(steps, conn)
            send.sent(ids(result))
        self._count_enqueued(queue, len(ids(result)))
        return result

    # -- workers: claim, then fenced writes --------------------------------------

    async def claim(self, queue: str, *, limit: int = 1, lease: float | None = None) -> Claims:
        """Claim up to ``limit`` jobs of ``queue`` in claim order: expired leases
        first (recovery), then by priority (higher first), age and id; in a queue
        with groups, the groups take turns. ``lease`` defaults to the queue's.
        Committed at once: work outside any transaction. The queue's limits hold
        (``configure_queue(max_running=..., rate_limit=...)``): ``held_back`` on
        the result says when one of them held the claim back."""
        steps = _steps.claim(self._store, queue, limit=limit, lease=lease)
        return await self._db.run_steps(steps)

    async def complete(
        self, claim: Claim, *, result: Any = None, conn: AsyncConnection | None = None
    ) -> None:
        """Complete a claim, or raise LeaseLost. ``result`` (JSON, at most 64 KiB) is
        stored with the completion, for ``result()`` and ``wait_result()``.

        With ``conn`` (your transaction, where an effect commits with the
        completion) a job this claim already completed raises AlreadyCompleted,
        so a re-run of the transaction rolls its effect back. Without it a
        resend after an ambiguous commit is accepted.
        """
        steps = _steps.complete(self._store, claim, result=result, strict=conn is not None)
        await self._db.run_steps(steps, conn)

    async def _hold_for_completion(self, claim: Claim, conn: AsyncConnection) -> None:
        """First in the caller's transaction (``conn``) that will complete ``claim``
        (JobContext's blocks of leaseq.contrib): in REPEATABLE READ or SERIALIZABLE
        the job's row is locked now, fenced (LeaseLost), so that the worker's
        renewals cannot make the completion a serialization failure."""
        await self._db.run(self._store.hold_for_completion(claim), conn)

    async def complete_many(
        self,
        claims: Sequence[Claim],
        *,
        results: Sequence[Any] | None = None,
        conn: AsyncConnection | None = None,
    ) -> list[tuple[Claim, bool]]:
        """Per claim, True if completed; with ``conn``, an earlier completion is False.
        ``results``: one per claim (None for none), stored with the completions."""
        return await self._db.run(
            self._store.complete(claims, results=results, strict=conn is not None), conn
        )

    async def renew(self, claim: Claim, *, lease: float | None = None) -> datetime:
        """Extend the lease: its new end, or LeaseLost. Waits while another transaction
        holds the job's row locked, so the answer is definite."""
        return await self._db.run(self._store.renew_one(claim, lease))

    async def renew_many(
        self, claims: Sequence[Claim], *, lease: float | None = None
    ) -> list[tuple[Claim, datetime | RenewalBusy | None]]:
        """Per claim: the new lease end; RENEWAL_BUSY (row locked by another transaction
        right now, lease still live and unchanged: renew again soon); None if lost.
        Never waits for a locked row, so one cannot delay the others' renewal."""
        return await self._db.run(self._store.renew(claims, lease))

    async def retry(
        self,
        claim: Claim,
        *,
        delay: float | None = None,
        error: object = None,
        conn: AsyncConnection | None = None,
    ) -> JobStatus:
        """Give the job back for another attempt (after ``delay``, else the queue's
        backoff): QUEUED, or FAILED when its attempts are used up. LeaseLost if this
        claim no longer owns it; with ``conn``, also if its retry already committed."""
        operation = self._store.retry_one(claim, delay=delay, error=error, strict=conn is not None)
        return await self._db.run(operation, conn)

    async def fail(
        self, claim: Claim, error: object = None, *, conn: AsyncConnection | None = None
    ) -> None:
        """Fail the job for good (kept, replayable), or raise LeaseLost; with ``conn``,
        also if its fail already committed."""
        await self._db.run(self._store.fail_one(claim, error, strict=conn is not None), conn)

    async def retry_many(
        self,
        claims: Sequence[Claim],
        *,
        delays: Sequence[float | None] | None = None,
        errors: Sequence[object] | None = None,
    ) -> list[tuple[Claim, JobStatus | None]]:
        """Per claim: the job's new status (QUEUED, or FAILED when exhausted); None if
        lost. A resend of this claim's committed retry answers what it did."""
        return await self._db.run(self._store.retry(claims, delays=delays, errors=errors))

    async def fail_many(
        self, claims: Sequence[Claim], errors: Sequence[object] | None = None
    ) -> list[tuple[Claim, bool]]:
        """Per claim: True if failed (now, or by this claim's committed fail)."""
        return await self._db.run(self._store.fail(claims, errors))

    async def release_many(
        self, claims: Sequence[Claim], *, handlers_running: Sequence[bool] | None = None
    ) -> list[tuple[Claim, bool]]:
        """Give unfinished claims back at once, without counting the attempt. A claim
        whose handler still runs (``handlers_running[i]``: a thread that cannot be
        stopped) may run again only once its lease would have ended."""
        return await self._db.run(self._store.release(claims, handlers_running=handlers_running))

    # async-only: begin
    # -- the worker's own needs (asyncio only) ---------------------------------------

    def _session(self) -> AbstractAsyncContextManager[Session]:
        """A connection of its own, outside the pool: session state (an advisory lock)
        lives as long as it does. Operations run on it with ``session.run()``."""
        return self._db.session()

    async def _run(self, operation: Operation[T], conn: AsyncConnection | None = None) -> T:
        """One of the store's operations (the scheduler's), on ``conn`` if given."""
        return await self._db.run(operation, conn)

    def _listen(self) -> AsyncIterator[str]:
        """Enqueue notifications of this schema (queue names), on a session of their
        own, until it breaks (TransientError); an empty payload first, once listening."""
        return self._db.listen(self._store.listen())

    # async-only: end


# async-only: begin
#: Connection settings for the worker's clients (keepalives, a TCP user timeout, no
#: long idle transactions), so that the worker needs nothing of the database layer.
WORKER_CONNECTIONS = WORKER_OPTIONS
#: The same, for the worker's sessions that send leaseq's statements only.
SERVICE_CONNECTIONS = SERVICE_OPTIONS
#: The acknowledgement session's, with durable acknowledgements turned off.
ASYNC_ACKNOWLEDGEMENT_CONNECTIONS = ASYNC_ACKNOWLEDGEMENT_OPTIONS
# async-only: end
