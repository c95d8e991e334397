"""The producer and operator API: :class:`Queue` (sync) and :class:`AsyncQueue`.

Both are thin: every method asks :class:`~leaseq.store.Store` for the operation
and hands it to :mod:`leaseq.db` to execute, so the two classes cannot drift.
Pass ``conn=`` (your own psycopg connection) to run an operation inside your
transaction: an enqueue then commits or rolls back with your business rows,
and a completion commits together with a handler's effect.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime
from types import TracebackType
from typing import Any, Self

from . import migrate as migrations
from .config import database_url
from .db import AsyncConnection, AsyncDatabase, Connection, Database
from .errors import BacklogFull
from .store import Store
from .types import Claim, Job, JobStatus, QueueSettings, QueueStats, ReapResult, RenewalBusy


class _Base:
    def __init__(
        self,
        dsn: str | None = None,
        *,
        schema: str = "leaseq",
        max_payload_bytes: int | None = None,
        notify: bool = True,
    ) -> None:
        self.store = Store(schema, max_payload_bytes=max_payload_bytes, notify=notify)
        self.dsn = database_url(dsn)
        # Queues whose settings row is known to be committed. An enqueue inside a
        # caller's transaction first makes sure of it on a connection of our own:
        # a row created inside that transaction would make every other producer
        # of the queue wait until it commits.
        self._known_queues: set[str] = set()

    @property
    def schema(self) -> str:
        return self.store.schema


class Queue(_Base):
    """A leaseq schema on one database, used from synchronous code."""

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
    ) -> None:
        super().__init__(dsn, schema=schema, max_payload_bytes=max_payload_bytes, notify=notify)
        self.db = Database(
            self.dsn, max_size=pool_size, options=connection_options, open_timeout=connect_timeout
        )

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.db.close()

    def _ensure_queue(self, queue: str) -> None:
        if queue not in self._known_queues:
            self.db.run(self.store.ensure_queue(queue))
            self._known_queues.add(queue)

    def migrate(self) -> list[int]:
        """Create or upgrade the schema; returns the migration versions applied now."""
        return self.db.drive(migrations.plan(self.store))

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
    ) -> int:
        operation = self.store.enqueue(
            queue, payload, delay=delay, run_at=run_at, priority=priority,
            max_attempts=max_attempts, key=key, seq=seq, idempotency_key=idempotency_key,
        )  # fmt: skip
        if conn is not None:
            self._ensure_queue(queue)
        return self.db.run(operation, conn)

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
    ) -> list[int]:
        operation = self.store.enqueue_many(
            queue, payloads, delay=delay, run_at=run_at, priority=priority,
            max_attempts=max_attempts, key=key, seqs=seqs,
        )  # fmt: skip
        if conn is not None:
            self._ensure_queue(queue)
        return self.db.run(operation, conn)

    def claim(self, queue: str, *, limit: int = 1, lease: float | None = None) -> list[Claim]:
        claimed = self.db.run(self.store.claim(queue, limit=limit, lease=lease))
        if not claimed.repairs_due:
            return claimed.claims
        # An ordering key met a producer in flight when it was last settled.
        self.db.run(self.store.repair_keys(queue))
        if claimed.claims:
            return claimed.claims
        return self.db.run(self.store.claim(queue, limit=limit, lease=lease)).claims

    def complete(self, claim: Claim, *, conn: Connection | None = None) -> None:
        """Complete a claim, or raise LeaseLost.

        With ``conn`` (your transaction, where an effect commits with the
        completion) a job this claim already completed raises AlreadyCompleted,
        so a re-run of the transaction rolls its effect back. Without it a
        resend after an ambiguous commit is accepted.
        """
        self.db.run(self.store.complete_one(claim, strict=conn is not None), conn)

    def complete_many(
        self, claims: Sequence[Claim], *, conn: Connection | None = None
    ) -> list[tuple[Claim, bool]]:
        """Per claim, True if completed; with ``conn``, an earlier completion is False."""
        return self.db.run(self.store.complete(claims, strict=conn is not None), conn)

    def renew(self, claim: Claim, *, lease: float | None = None) -> datetime:
        """Extend the lease: its new end, or LeaseLost. Waits while another transaction
        holds the job's row locked, so the answer is definite."""
        return self.db.run(self.store.renew_one(claim, lease))

    def renew_many(
        self, claims: Sequence[Claim], *, lease: float | None = None
    ) -> list[tuple[Claim, datetime | RenewalBusy | None]]:
        """Per claim: the new lease end; RENEWAL_BUSY (row locked by another transaction
        right now, lease still live and unchanged: renew again soon); None if lost.
        Never waits for a locked row, so one cannot delay the others' renewal."""
        return self.db.run(self.store.renew(claims, lease))

    def retry(
        self,
        claim: Claim,
        *,
        delay: float | None = None,
        error: object = None,
        conn: Connection | None = None,
    ) -> JobStatus:
        operation = self.store.retry_one(claim, delay=delay, error=error, strict=conn is not None)
        return self.db.run(operation, conn)

    def fail(self, claim: Claim, error: object = None, *, conn: Connection | None = None) -> None:
        self.db.run(self.store.fail_one(claim, error, strict=conn is not None), conn)

    def retry_many(
        self,
        claims: Sequence[Claim],
        *,
        delays: Sequence[float | None] | None = None,
        errors: Sequence[object] | None = None,
    ) -> list[tuple[Claim, JobStatus | None]]:
        return self.db.run(self.store.retry(claims, delays=delays, errors=errors))

    def fail_many(
        self, claims: Sequence[Claim], errors: Sequence[object] | None = None
    ) -> list[tuple[Claim, bool]]:
        return self.db.run(self.store.fail(claims, errors))

    def release_many(self, claims: Sequence[Claim]) -> list[tuple[Claim, bool]]:
        """Give unfinished claims back at once, without counting the attempt."""
        return self.db.run(self.store.release(claims))

    def reap(self, *, limit: int = 1000) -> ReapResult:
        return self.db.run(self.store.reap(limit=limit))

    def replay(self, job_id: int) -> bool:
        return self.db.run(self.store.replay(job_id))

    def replay_failed(self, queue: str, *, batch: int = 1000) -> list[int]:
        """Replay every failed job of ``queue`` in batches of short transactions;
        returns their ids. A queue with admission limits takes back only what
        fits: then BacklogFull is raised, its ``replayed`` holding what was done."""
        replayed: list[int] = []
        while True:
            result = self.db.run(self.store.replay_failed(queue, limit=batch))
            replayed += result.replayed
            if result.refused:
                raise _queue_full(queue, result.refused, replayed)
            if result.exhausted:
                return replayed

    def cancel(self, job_id: int) -> bool:
        return self.db.run(self.store.cancel(job_id))

    def get(self, job_id: int) -> Job:
        return self.db.run(self.store.get(job_id))

    def list_jobs(
        self, status: JobStatus | str, *, queue: str | None = None, limit: int = 100
    ) -> list[Job]:
        return self.db.run(self.store.list_jobs(status, queue=queue, limit=limit))

    def stats(self, queue: str | None = None) -> list[QueueStats]:
        return self.db.run(self.store.stats(queue))

    def configure_queue(self, name: str, **settings: Any) -> QueueSettings:
        return self.db.run(self.store.configure_queue(name, **settings))

    def queue_settings(self, name: str) -> QueueSettings | None:
        return self.db.run(self.store.queue_settings(name))


class AsyncQueue(_Base):
    """The same operations as :class:`Queue`, for asyncio code."""

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
    ) -> None:
        super().__init__(dsn, schema=schema, max_payload_bytes=max_payload_bytes, notify=notify)
        self.db = AsyncDatabase(
            self.dsn, max_size=pool_size, options=connection_options, open_timeout=connect_timeout
        )

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:  # fmt: skip
        await self.close()

    async def close(self) -> None:
        await self.db.close()

    async def _ensure_queue(self, queue: str) -> None:
        if queue not in self._known_queues:
            await self.db.run(self.store.ensure_queue(queue))
            self._known_queues.add(queue)

    async def migrate(self) -> list[int]:
        return await self.db.drive(migrations.plan(self.store))

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
    ) -> int:
        operation = self.store.enqueue(
            queue, payload, delay=delay, run_at=run_at, priority=priority,
            max_attempts=max_attempts, key=key, seq=seq, idempotency_key=idempotency_key,
        )  # fmt: skip
        if conn is not None:
            await self._ensure_queue(queue)
        return await self.db.run(operation, conn)

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
    ) -> list[int]:
        operation = self.store.enqueue_many(
            queue, payloads, delay=delay, run_at=run_at, priority=priority,
            max_attempts=max_attempts, key=key, seqs=seqs,
        )  # fmt: skip
        if conn is not None:
            await self._ensure_queue(queue)
        return await self.db.run(operation, conn)

    async def claim(self, queue: str, *, limit: int = 1, lease: float | None = None) -> list[Claim]:
        claimed = await self.db.run(self.store.claim(queue, limit=limit, lease=lease))
        if not claimed.repairs_due:
            return claimed.claims
        await self.db.run(self.store.repair_keys(queue))
        if claimed.claims:
            return claimed.claims
        return (await self.db.run(self.store.claim(queue, limit=limit, lease=lease))).claims

    async def complete(self, claim: Claim, *, conn: AsyncConnection | None = None) -> None:
        """Complete a claim, or raise LeaseLost.

        With ``conn`` (your transaction, where an effect commits with the
        completion) a job this claim already completed raises AlreadyCompleted,
        so a re-run of the transaction rolls its effect back. Without it a
        resend after an ambiguous commit is accepted.
        """
        await self.db.run(self.store.complete_one(claim, strict=conn is not None), conn)

    async def complete_many(
        self, claims: Sequence[Claim], *, conn: AsyncConnection | None = None
    ) -> list[tuple[Claim, bool]]:
        """Per claim, True if completed; with ``conn``, an earlier completion is False."""
        return await self.db.run(self.store.complete(claims, strict=conn is not None), conn)

    async def renew(self, claim: Claim, *, lease: float | None = None) -> datetime:
        """See :meth:`Queue.renew`: waits for a locked row; LeaseLost if lost."""
        return await self.db.run(self.store.renew_one(claim, lease))

    async def renew_many(
        self, claims: Sequence[Claim], *, lease: float | None = None
    ) -> list[tuple[Claim, datetime | RenewalBusy | None]]:
        """See :meth:`Queue.renew_many`: renewed, RENEWAL_BUSY or None, never waiting."""
        return await self.db.run(self.store.renew(claims, lease))

    async def retry(
        self,
        claim: Claim,
        *,
        delay: float | None = None,
        error: object = None,
        conn: AsyncConnection | None = None,
    ) -> JobStatus:
        operation = self.store.retry_one(claim, delay=delay, error=error, strict=conn is not None)
        return await self.db.run(operation, conn)

    async def fail(
        self, claim: Claim, error: object = None, *, conn: AsyncConnection | None = None
    ) -> None:
        await self.db.run(self.store.fail_one(claim, error, strict=conn is not None), conn)

    async def retry_many(
        self,
        claims: Sequence[Claim],
        *,
        delays: Sequence[float | None] | None = None,
        errors: Sequence[object] | None = None,
    ) -> list[tuple[Claim, JobStatus | None]]:
        return await self.db.run(self.store.retry(claims, delays=delays, errors=errors))

    async def fail_many(
        self, claims: Sequence[Claim], errors: Sequence[object] | None = None
    ) -> list[tuple[Claim, bool]]:
        return await self.db.run(self.store.fail(claims, errors))

    async def release_many(self, claims: Sequence[Claim]) -> list[tuple[Claim, bool]]:
        """Give unfinished claims back at once, without counting the attempt."""
        return await self.db.run(self.store.release(claims))

    async def reap(self, *, limit: int = 1000) -> ReapResult:
        return await self.db.run(self.store.reap(limit=limit))

    async def replay(self, job_id: int) -> bool:
        return await self.db.run(self.store.replay(job_id))

    async def replay_failed(self, queue: str, *, batch: int = 1000) -> list[int]:
        """See :meth:`Queue.replay_failed`."""
        replayed: list[int] = []
        while True:
            result = await self.db.run(self.store.replay_failed(queue, limit=batch))
            replayed += result.replayed
            if result.refused:
                raise _queue_full(queue, result.refused, replayed)
            if result.exhausted:
                return replayed

    async def cancel(self, job_id: int) -> bool:
        return await self.db.run(self.store.cancel(job_id))

    async def get(self, job_id: int) -> Job:
        return await self.db.run(self.store.get(job_id))

    async def list_jobs(
        self, status: JobStatus | str, *, queue: str | None = None, limit: int = 100
    ) -> list[Job]:
        return await self.db.run(self.store.list_jobs(status, queue=queue, limit=limit))

    async def stats(self, queue: str | None = None) -> list[QueueStats]:
        return await self.db.run(self.store.stats(queue))

    async def configure_queue(self, name: str, **settings: Any) -> QueueSettings:
        return await self.db.run(self.store.configure_queue(name, **settings))

    async def queue_settings(self, name: str) -> QueueSettings | None:
        return await self.db.run(self.store.queue_settings(name))


def _queue_full(queue: str, refused: int, replayed: list[int]) -> BacklogFull:
    return BacklogFull(
        f"queue {queue} is full: replayed {len(replayed)} failed jobs, "
        f"{refused} or more left failed",
        replayed=tuple(replayed),
    )
