"""What a handler receives: the job, its fencing token, and a lost-lease signal."""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any, NoReturn

from .. import _validate_payloads as payload_checks
from .._async_client import AsyncConnection, AsyncQueue
from .._errors import InvalidArgument, LeaseLost
from .._retry import Retry
from .._sync_client import Connection, Queue
from .._types import Claim

#: Held while a context's ``lost`` Event is made, or the context is marked lost:
#: the Event made on first use must see a mark that came before it.
_MAKING_EVENTS = threading.Lock()


class JobContext:
    """One attempt of one job, as its handler sees it.

    ``lost`` is set when this attempt must stop: its lease could not be renewed
    in time, its timeout passed, or the worker is shutting down. Stop work that
    can be stopped; from then on :meth:`transaction` refuses, and what the
    handler returns is never acknowledged as the job's completion (a timed-out
    attempt reports its timeout once the handler has returned).
    """

    def __init__(
        self,
        claim: Claim,
        sync_queue: Queue,
        async_queue: AsyncQueue,
        max_result_bytes: int = payload_checks.DEFAULT_MAX_RESULT_BYTES,
    ) -> None:
        self.claim = claim
        #: The task's cap on ``job.result`` (``max_result_bytes``), for completions
        #: through :meth:`transaction` as for returned values.
        self.max_result_bytes = max_result_bytes
        # ``lost`` is made on first use: most handlers never look at it, and an
        # Event (with its Condition and lock) was ~4 µs of every job's ~60 µs of
        # the worker's own time. ``_lost_flag`` is what leaseq itself reads.
        self._lost: threading.Event | None = None
        self._lost_flag = False
        self.lost_reason: str | None = None
        self.completed = False
        #: The job's result when :meth:`transaction` completes it (a handler that
        #: completes through it sets this inside the block; its return value
        #: comes too late for that completion).
        self.result: Any = None
        #: ``result`` as it was when :meth:`transaction` committed the completion:
        #: what the job stores. The handler may change ``result`` after the block
        #: (a refused second transaction, a plain assignment): not the job's.
        self._committed_result: Any = None
        self._sync = sync_queue
        self._async = async_queue
        self._transaction_open = False
        #: True from the fenced completion of :meth:`transaction` (or a
        #: ``leaseq.contrib`` block) to its commit or rollback. The fence then has
        #: the last word, not the worker's local deadline: a completion waiting for
        #: a row lock while the deadline passes commits if the database lease
        #: still held, and the attempt is done, never lost.
        self.completing = False

    @property
    def lost(self) -> threading.Event:
        """Set once this attempt must stop (see the class): test it, or wait on it."""
        event = self._lost
        if event is None:
            with _MAKING_EVENTS:  # a handler's thread and the loop may both ask first
                if self._lost is None:
                    self._lost = threading.Event()
                    if self._lost_flag:
                        self._lost.set()
                event = self._lost
        return event

    @property
    def job_id(self) -> int:
        return self.claim.job_id

    @property
    def queue(self) -> str:
        return self.claim.queue

    @property
    def payload(self) -> Any:
        return self.claim.payload

    @property
    def idempotency_key(self) -> str:
        """Stable across attempts and replays: the key for outside effects."""
        return self.claim.idempotency_key

    @property
    def attempts(self) -> int:
        return self.claim.attempts

    @property
    def max_attempts(self) -> int:
        return self.claim.max_attempts

    @property
    def lease_version(self) -> int:
        """A fencing token that grows with every claim, for destinations that accept one."""
        return self.claim.lease_version

    @property
    def key(self) -> str | None:
        return self.claim.key

    @property
    def seq(self) -> int | None:
        return self.claim.seq

    def retry(self, delay: float | None = None, reason: str = "retry requested") -> NoReturn:
        """Ask for another attempt (after ``delay`` seconds, else the backoff)."""
        raise Retry(delay, reason)

    def mark_lost(self, reason: str) -> None:
        with _MAKING_EVENTS:
            if self._lost_flag:
                return
            self.lost_reason = reason
            self._lost_flag = True
            event = self._lost
        if event is not None:
            event.set()

    def _check_owned(self) -> None:
        if self._lost_flag:
            raise LeaseLost(self.claim.job_id, self.claim.lease_version, "transaction")

    def _check_may_open_transaction(self) -> None:
        """No job.transaction() inside another: the inner one would complete the
        job, and the outer one's completion then be refused, rolling its writes
        back in silence. (One after the first committed is refused by the
        database: AlreadyCompleted, its writes rolled back.)"""
        self._check_owned()
        if self._transaction_open:
            raise InvalidArgument(
                f"job {self.claim.job_id}: its job.transaction() (or a leaseq.contrib block "
                "that completes it) is already open; write on that block's connection (a "
                "nested one would complete the job on its own)"
            )

    @contextmanager
    def _completing_block(self) -> Iterator[None]:
        """Held by each block whose commit completes the job: :meth:`transaction`,
        :meth:`atransaction`, and leaseq.contrib's (``job_session``,
        ``job_atomic``...). A second one inside it raises InvalidArgument before
        anything is written (it would complete the job on its own connection, and
        the outer block's effect then roll back with AlreadyCompleted: a job done
        without it); so does one for an attempt already lost (LeaseLost)."""
        self._check_may_open_transaction()
        self._transaction_open = True
        try:
            yield
        finally:
            self._transaction_open = False

    @contextmanager
    def connection(self) -> Iterator[Connection]:
        """A pooled autocommit connection, for writes that are not the job's effect."""
        with self._sync.connection() as conn:
            yield conn

    @contextmanager
    def transaction(self) -> Iterator[Connection]:
        """A transaction for the handler's effect that also completes the job.

        Write your business rows on the yielded connection; on leaving the block
        the fenced completion runs in the same transaction, then it commits. If
        this attempt lost its lease, the completion raises LeaseLost and the
        effect rolls back with it: effects in this database happen once. Set
        ``job.result`` inside the block to store a result with that completion.
        """
        with self._completing_block():
            try:
                with self._sync.connection() as conn:
                    with conn.transaction():
                        yield conn
                        self.completing = True  # until the commit (or rollback) below
                        self.complete_in(conn)
                    self.mark_completed()
            finally:
                self.completing = False

    @asynccontextmanager
    async def atransaction(self) -> AsyncIterator[AsyncConnection]:
        """The async twin of :meth:`transaction`, for ``async def`` handlers."""
        with self._completing_block():
            try:
                async with self._async.connection() as conn:
                    async with conn.transaction():
                        yield conn
                        self.completing = True
                        await self.acomplete_in(conn)
                    self.mark_completed()
            finally:
                self.completing = False

    def _hold_in(self, conn: Connection) -> None:
        """First inside a transaction :meth:`complete_in` will complete the job in
        (leaseq.contrib's blocks): in REPEATABLE READ or SERIALIZABLE, lock the
        job's row before the effect's statements, or a renewal of the lease
        during the block made the completion a serialization failure (the
        effect rolled back, each attempt again). LeaseLost if already lost."""
        self._check_owned()
        self._sync._hold_for_completion(self.claim, conn)

    async def _ahold_in(self, conn: AsyncConnection) -> None:
        """The async twin of :meth:`_hold_in`."""
        self._check_owned()
        await self._async._hold_for_completion(self.claim, conn)

    def complete_in(self, conn: Connection) -> None:
        """Complete the job inside the transaction open on ``conn``, with ``job.result``.

        For transactions leaseq does not open: an ORM session's (the psycopg
        connection under it), a framework's atomic block. Call it last inside
        that transaction, and :meth:`mark_completed` once it committed
        (``leaseq.contrib`` does both). The completion is fenced: if this attempt
        no longer holds its lease it raises LeaseLost (AlreadyCompleted for a
        second completion), and the transaction must roll back with the effect.
        """
        self._check_owned()
        self._sync.complete(self.claim, result=self._stored_result(), conn=conn)

    async def acomplete_in(self, conn: AsyncConnection) -> None:
        """The async twin of :meth:`complete_in`."""
        self._check_owned()
        await self._async.complete(self.claim, result=self._stored_result(), conn=conn)

    def _stored_result(self) -> payload_checks.EncodedPayload | None:
        """``job.result`` checked against the task's cap (the client's own
        check knows only the default): InvalidResult fails the job at once."""
        return payload_checks.result(self.result, self.max_result_bytes)

    def mark_completed(self) -> None:
        """Say that the transaction of :meth:`complete_in` committed: the worker
        then sends no acknowledgement of its own, and stops renewing the lease.
        (Without it the worker's acknowledgement recognises the committed
        completion and changes nothing.)"""
        if not self.completed:  # (the result of the completion that committed)
            self._committed_result = self.result
        self.completed = True

    def _completed_with(self, result: Any) -> None:
        """Said by the worker for a completion committed elsewhere (a process
        handler's child), with the result that completion stored."""
        self.result = self._committed_result = result
        self.completed = True

    @property
    def outcome_result(self) -> Any:
        """The job's result as acknowledged, for the on_success hooks: the one its
        committed job.transaction() stored, else what the handler returned."""
        return self._committed_result if self.completed else self.result
