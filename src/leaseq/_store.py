"""Every queue operation, written once and without I/O.

Each public method returns an :class:`Operation`: the SQL, its parameters and
a function that turns the rows into the result. ``db`` executes it on a sync
or an async connection; neither side builds SQL of its own. The SQL itself
lives in ``sql/*.sql``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar

from . import _decoding as decoding
from . import _validate as validate
from ._errors import (
    AlreadyCompleted,
    BacklogFull,
    InvalidArgument,
    InvalidJob,
    JobNotFound,
    LeaseLost,
)
from ._statement import Operation, Rows, Statement, T, notify_channel, sql_text
from ._types import (
    RENEWAL_BUSY,
    Claim,
    Job,
    JobStatus,
    QueueSettings,
    QueueStats,
    ReapResult,
    RenewalBusy,
)

#: Raised by job_running_key_idx when a claim lost a race for an ordering key.
UNIQUE_VIOLATION = "23505"


@dataclass(frozen=True, slots=True)
class Claimed:
    """What one claim statement returned: the claims, and whether repair notes
    of the queue are due (the client then runs :meth:`Store.repair_keys`)."""

    claims: list[Claim]
    repairs_due: bool


@dataclass(frozen=True, slots=True)
class ReplayBatch:
    """One batch of replay_failed: ids replayed, how many the queue had no room
    for, and whether the batch reached the end of the queue's failed jobs."""

    replayed: list[int]
    refused: int
    exhausted: bool


def _ignore(_: list[Rows]) -> None:
    return None


class Store:
    """Builds the operations of one leaseq schema."""

    def __init__(
        self, schema: str = "leaseq", *, max_payload_bytes: int | None = None, notify: bool = True
    ) -> None:
        self.schema = validate.schema_name(schema)
        #: LISTEN/NOTIFY channel of this schema; enqueues send the queue's name on it.
        self.channel = notify_channel(self.schema)
        self._notify_channel = self.channel if notify else None
        self.max_payload_bytes = max_payload_bytes or validate.DEFAULT_MAX_PAYLOAD_BYTES
        self._quoted = f'"{self.schema}"'
        self._texts: dict[str, str] = {}

    def sql(self, name: str) -> str:
        text = self._texts.get(name)
        if text is None:
            text = self._texts[name] = self.render(sql_text(name))
        return text

    def render(self, text: str) -> str:
        return text.replace("{schema}", self._quoted)

    # -- producers ---------------------------------------------------------

    def enqueue(
        self,
        queue: str,
        payload: Any,
        *,
        delay: float | None = None,
        run_at: datetime | None = None,
        priority: int = 0,
        max_attempts: int | None = None,
        key: str | None = None,
        seq: int | None = None,
        idempotency_key: str | None = None,
    ) -> Operation[int]:
        encoded = validate.payload(payload, self.max_payload_bytes)
        ordering_key, ordering_seq = validate.ordering(key, seq)
        params = {
            "queue": validate.queue_name(queue),
            "channel": self._notify_channel,
            "payload": encoded.text,
            "payload_bytes": encoded.size,
            **self._schedule(delay, run_at, priority, max_attempts),
            "key": ordering_key,
            "seq": ordering_seq,
            "idempotency_key": None
            if idempotency_key is None
            else validate.text_key(idempotency_key, "idempotency key"),
        }
        return Operation((Statement(self.sql("enqueue.sql"), params),), lambda r: r[0][0][0])

    def enqueue_many(
        self,
        queue: str,
        payloads: Iterable[Any],
        *,
        delay: float | None = None,
        run_at: datetime | None = None,
        priority: int = 0,
        max_attempts: int | None = None,
        key: str | None = None,
        seqs: Sequence[int] | None = None,
    ) -> Operation[list[int]]:
        encoded = [validate.payload(p, self.max_payload_bytes) for p in payloads]
        if seqs is not None and len(seqs) != len(encoded):
            raise InvalidJob("seqs must have one entry per payload")
        ordering = [
            validate.ordering(key, None if seqs is None else seqs[i]) for i in range(len(encoded))
        ]
        params = {
            "queue": validate.queue_name(queue),
            "channel": self._notify_channel,
            "payloads": [e.text for e in encoded],
            "payload_bytes": [e.size for e in encoded],
            "count": len(encoded),
            "total_bytes": sum(e.size for e in encoded),
            "largest_bytes": max((e.size for e in encoded), default=0),
            **self._schedule(delay, run_at, priority, max_attempts),
            "key": ordering[0][0] if ordering else None,
            "seqs": [seq for _, seq in ordering],
        }
        return Operation(
            (Statement(self.sql("enqueue_many.sql"), params),),
            lambda r: sorted(row[0] for row in r[0]),
        )

    @staticmethod
    def _schedule(
        delay: float | None, run_at: datetime | None, priority: int, max_attempts: int | None
    ) -> dict[str, Any]:
        if delay is not None and run_at is not None:
            raise InvalidJob("give delay or run_at, not both")
        return {
            "delay": validate.delay(delay),
            "run_at": validate.run_at(run_at),
            "priority": validate.integer(priority, "priority", validate.PRIORITY_RANGE),
            "max_attempts": None
            if max_attempts is None
            else validate.integer(max_attempts, "max_attempts", range(1, 1001)),
        }

    # -- workers: claim, then fenced writes -----------------------------------

    def claim(
        self, queue: str, *, limit: int = 1, lease: float | None = None
    ) -> Operation[Claimed]:
        params = {
            "queue": validate.queue_name(queue),
            "limit": validate.claim_limit(limit),
            "lease": validate.lease(lease),
        }
        schema = self.schema

        def decode(rows: list[Rows]) -> Claimed:
            claims = [decoding.claim_from_row(schema, row) for row in rows[0] if row[0] is not None]
            repairs_due = len(claims) < len(rows[0])  # the marker row has no job id
            return Claimed(claims, repairs_due)  # in claim order (see claim.sql)

        return Operation(
            (Statement(self.sql("claim.sql"), params),),
            decode,
            retry_on=frozenset({UNIQUE_VIOLATION}),
        )

    def repair_keys(self, queue: str, *, limit: int = 100) -> Operation[int]:
        """Settle the ordering keys of ``queue`` whose repair notes are due."""
        params = {"queue": validate.queue_name(queue), "limit": validate.claim_limit(limit)}
        return Operation(
            (Statement(self.sql("repair_keys.sql"), params),), lambda r: int(r[0][0][0])
        )

    def complete(
        self, claims: Sequence[Claim], *, strict: bool = False
    ) -> Operation[list[tuple[Claim, bool]]]:
        """Per claim: True if completed, False if lost.

        Not strict, a completion this claim already committed counts as done (a
        resend). Strict (inside a caller's transaction, where an effect commits
        with it), it is refused: a re-run of that transaction must not commit twice.
        """
        return self._fenced("complete.sql", claims, {"strict": strict}, lambda row: bool(row[1]))

    def renew(
        self, claims: Sequence[Claim], lease: float | None = None
    ) -> Operation[list[tuple[Claim, datetime | RenewalBusy | None]]]:
        """Per claim: the new lease_until; RENEWAL_BUSY if another transaction holds the
        job's row locked right now while its lease is still live (unchanged: try again);
        None if the lease was lost. Never waits for a locked row."""
        leases = [validate.lease(lease)] * len(claims)
        return self._fenced(
            "renew.sql",
            claims,
            {"leases": leases},
            lambda row: RENEWAL_BUSY if row[2] else row[1],
        )

    def retry(
        self,
        claims: Sequence[Claim],
        *,
        delays: Sequence[float | None] | None = None,
        errors: Sequence[object] | None = None,
        strict: bool = False,
    ) -> Operation[list[tuple[Claim, JobStatus | None]]]:
        """Per claim: the job's new status (queued, or failed when exhausted), None if lost.

        A None delay takes the queue's backoff. Not strict, a retry this claim
        already committed is reported again; strict (in a caller's transaction),
        it is refused.
        """
        extra = {
            "strict": strict,
            "delays": [
                None if d is None else validate.seconds(d, "delay", validate.MAX_DELAY_SECONDS)
                for d in validate.aligned(delays, claims, "delays")
            ],
            "errors": [validate.error_text(e) for e in validate.aligned(errors, claims, "errors")],
        }
        return self._fenced(
            "retry.sql", claims, extra, lambda row: None if row[1] is None else JobStatus(row[1])
        )

    def fail(
        self,
        claims: Sequence[Claim],
        errors: Sequence[object] | None = None,
        *,
        strict: bool = False,
    ) -> Operation[list[tuple[Claim, bool]]]:
        """Per claim: True if failed (now, or by this claim before unless strict), False if lost."""
        extra = {
            "strict": strict,
            "errors": [validate.error_text(e) for e in validate.aligned(errors, claims, "errors")],
        }
        return self._fenced("fail.sql", claims, extra, lambda row: bool(row[1]))

    def release(self, claims: Sequence[Claim]) -> Operation[list[tuple[Claim, bool]]]:
        """Give unfinished claims back at once (shutdown); the attempt is not counted.

        Per claim: True if released (now or by an earlier commit of this claim)."""
        return self._fenced("release.sql", claims, {}, lambda row: bool(row[1]))

    def _fenced(
        self,
        name: str,
        claims: Sequence[Claim],
        extra: dict[str, Any],
        result: Callable[[tuple[Any, ...]], T],
    ) -> Operation[list[tuple[Claim, T]]]:
        if len({c.job_id for c in claims}) != len(claims):
            raise InvalidArgument("a batch must not hold the same job twice")
        params = {
            "job_ids": [c.job_id for c in claims],
            "lease_versions": [c.lease_version for c in claims],
            **extra,
        }

        def decode(rows: list[Rows]) -> list[tuple[Claim, T]]:
            by_id = {row[0]: result(row) for row in rows[0]}
            return [(c, by_id[c.job_id]) for c in claims]

        return Operation((Statement(self.sql(name), params),), decode)

    # The single-claim forms raise LeaseLost instead of reporting it.

    def complete_one(self, claim: Claim, *, strict: bool = False) -> Operation[None]:
        """Complete one claim, or raise LeaseLost (AlreadyCompleted, when strict and
        this claim's completion already committed)."""
        batch = self._fenced(
            "complete.sql", [claim], {"strict": strict}, lambda row: (bool(row[1]), bool(row[2]))
        )

        def decode(rows: list[Rows]) -> None:
            ((_, (accepted, already_done)),) = batch.decode(rows)
            if already_done and not accepted:
                raise AlreadyCompleted(claim.job_id, claim.lease_version, "complete")
            if not accepted:
                raise LeaseLost(claim.job_id, claim.lease_version, "complete")

        return Operation(batch.statements, decode)

    def renew_one(self, claim: Claim, lease: float | None = None) -> Operation[datetime]:
        """The new lease_until, or LeaseLost. Unlike the batch it waits for a locked row
        (as the other single-claim writes do), so the answer is never "busy"."""
        params = {
            "job_id": claim.job_id,
            "lease_version": claim.lease_version,
            "lease": validate.lease(lease),
        }

        def decode(rows: list[Rows]) -> datetime:
            if not rows[0]:
                raise LeaseLost(claim.job_id, claim.lease_version, "renew")
            until: datetime = rows[0][0][0]
            return until

        return Operation((Statement(self.sql("renew_one.sql"), params),), decode)

    def retry_one(
        self,
        claim: Claim,
        *,
        delay: float | None = None,
        error: object = None,
        strict: bool = False,
    ) -> Operation[JobStatus]:
        operation = self.retry([claim], delays=[delay], errors=[error], strict=strict)
        return _only(operation, "retry", lambda status: status or _LOST)

    def fail_one(
        self, claim: Claim, error: object = None, *, strict: bool = False
    ) -> Operation[None]:
        operation = self.fail([claim], [error], strict=strict)
        return _only(operation, "fail", lambda ok: None if ok else _LOST)

    # -- operators ------------------------------------------------------------

    def reap(self, *, limit: int = 1000) -> Operation[ReapResult]:
        params = {"limit": validate.claim_limit(limit)}

        def decode(rows: list[Rows]) -> ReapResult:
            return ReapResult(
                exhausted_queued=tuple(r[0] for r in rows[0] if r[1] == "queued"),
                expired_running=tuple(r[0] for r in rows[0] if r[1] == "running"),
            )

        return Operation((Statement(self.sql("reap.sql"), params),), decode)

    def replay(self, job_id: int) -> Operation[bool]:
        """True if replayed, False if the job was not failed or cancelled;
        BacklogFull (nothing written) if its queue has no room for it."""
        params = {"job_id": validate.job_id(job_id), "queue": None, "limit": 1}

        def decode(rows: list[Rows]) -> bool:
            if not rows[0]:
                raise JobNotFound(f"no job {job_id}")
            ((_, status, changed, refused),) = rows[0]
            if refused:
                raise BacklogFull(f"queue of job {job_id} is full: {status} job not replayed")
            return bool(changed)

        return Operation((Statement(self.sql("replay.sql"), params),), decode)

    def replay_failed(self, queue: str, *, limit: int = 1000) -> Operation[ReplayBatch]:
        """Replay one batch of up to ``limit`` failed jobs of ``queue``, oldest first,
        as many as its backlog limits have room for."""
        params = {
            "job_id": None,
            "queue": validate.queue_name(queue),
            "limit": validate.claim_limit(limit),
        }

        def decode(rows: list[Rows]) -> ReplayBatch:
            return ReplayBatch(
                replayed=[row[0] for row in rows[0] if row[2]],
                refused=sum(1 for row in rows[0] if row[3]),
                exhausted=len(rows[0]) < limit,
            )

        return Operation((Statement(self.sql("replay.sql"), params),), decode)

    def cancel(self, job_id: int) -> Operation[bool]:
        return self._transition("cancel.sql", job_id, {"job_id": validate.job_id(job_id)})

    def _transition(self, name: str, job_id: int, params: dict[str, Any]) -> Operation[bool]:
        def decode(rows: list[Rows]) -> bool:
            if not rows[0]:
                raise JobNotFound(f"no job {job_id}")
            return bool(rows[0][0][2])

        return Operation((Statement(self.sql(name), params),), decode)

    def get(self, job_id: int) -> Operation[Job]:
        schema = self.schema

        def decode(rows: list[Rows]) -> Job:
            if not rows[0]:
                raise JobNotFound(f"no job {job_id}")
            return decoding.job_from_row(schema, rows[0][0])

        return Operation(
            (Statement(self.sql("get_job.sql"), {"job_id": validate.job_id(job_id)}),), decode
        )

    def list_jobs(
        self, status: JobStatus | str, *, queue: str | None = None, limit: int = 100
    ) -> Operation[list[Job]]:
        try:
            state = JobStatus(status)
        except ValueError:
            raise InvalidArgument(f"unknown job status {status!r}") from None
        params = {
            "status": state.value,
            "queue": None if queue is None else validate.queue_name(queue),
            "limit": validate.claim_limit(limit),
        }
        schema = self.schema
        return Operation(
            (Statement(self.sql("list_jobs.sql"), params),),
            lambda r: [decoding.job_from_row(schema, row) for row in r[0]],
        )

    def stats(self, queue: str | None = None) -> Operation[list[QueueStats]]:
        params = {"queue": None if queue is None else validate.queue_name(queue)}

        return Operation(
            (Statement(self.sql("stats.sql"), params),),
            lambda r: [decoding.stats_from_row(row) for row in r[0]],
        )

    def configure_queue(self, name: str, **settings: Any) -> Operation[QueueSettings]:
        params: dict[str, Any] = {
            "name": validate.queue_name(name),
            **validate.queue_settings(settings),
        }
        named = {"name": params["name"]}
        return Operation(
            (
                Statement(self.sql("configure_queue_ensure.sql"), named),
                Statement(self.sql("configure_queue_update.sql"), params),
                Statement(self.sql("count_backlog.sql"), named),
                Statement(
                    self.sql("settle_failed_keys.sql"),
                    {**named, "set_ordering_policy": params["set_ordering_policy"]},
                ),
                Statement(self.sql("get_queue.sql"), named),
            ),
            lambda r: decoding.settings_from_row(r[-1][0]),
        )

    def ensure_queue(self, name: str) -> Operation[None]:
        """Create the queue's settings row with defaults if it does not exist."""
        params = {"name": validate.queue_name(name)}
        return Operation((Statement(self.sql("configure_queue_ensure.sql"), params),), _ignore)

    def queue_settings(self, name: str) -> Operation[QueueSettings | None]:
        params = {"name": validate.queue_name(name)}
        return Operation(
            (Statement(self.sql("get_queue.sql"), params),),
            lambda r: decoding.settings_from_row(r[0][0]) if r[0] else None,
        )

    # -- schema -----------------------------------------------------------------

    def listen(self) -> Statement:
        return Statement(self.sql("listen.sql").replace("{channel}", f'"{self.channel}"'))

    def maintenance_lock(self) -> Operation[bool]:
        params = {"schema_name": self.schema}
        return Operation(
            (Statement(self.sql("maintenance_lock.sql"), params),), lambda r: bool(r[0][0][0])
        )

    def migration_lock(self) -> Statement:
        return Statement(self.sql("migrate/lock.sql"), {"schema_name": self.schema})

    def migration_prepare(self) -> Statement:
        return Statement(self.sql("migrate/prepare.sql"))

    def applied_migrations(self) -> Statement:
        return Statement(self.sql("migrate/applied.sql"))

    def migration(self, text: str) -> Statement:
        return Statement(self.render(text))

    def record_migration(self, version: int, name: str) -> Statement:
        return Statement(self.sql("migrate/record.sql"), {"version": version, "name": name})

    def schema_catalog(self) -> Operation[list[str]]:
        """A server-independent description of the schema (the golden dump's lines)."""
        quoted, plain = self._quoted + ".", self.schema + "."

        def normalise(text: str) -> str:
            return text.replace(quoted, "<schema>.").replace(plain, "<schema>.")

        return Operation(
            (Statement(self.sql("schema_catalog.sql"), {"schema_name": self.schema}),),
            lambda r: [f"{kind}: {normalise(text)}" for kind, text in r[0]],
        )

    def set_clock_offset(self, offset_seconds: float) -> Operation[None]:
        offset = float(offset_seconds)
        if not math.isfinite(offset) or abs(offset) > 100 * 365 * 86400:
            raise InvalidArgument(f"clock offset out of range: {offset_seconds!r}")
        text = self.sql("set_clock_offset.sql").replace("{offset_seconds}", repr(offset))
        return Operation((Statement(text),), _ignore)


_LOST: Any = object()
R = TypeVar("R")


def _only(
    batch: Operation[list[tuple[Claim, R]]], name: str, outcome: Callable[[R], T]
) -> Operation[T]:
    """The one-claim form of a fenced batch: its outcome, or LeaseLost."""

    def decode(rows: list[Rows]) -> T:
        ((claim, result),) = batch.decode(rows)
        value = outcome(result)
        if value is _LOST:
            raise LeaseLost(claim.job_id, claim.lease_version, name)
        return value

    return Operation(batch.statements, decode)
