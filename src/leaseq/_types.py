"""Plain values that cross the public API: frozen, no I/O."""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any


class JobStatus(enum.StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def finished(self) -> bool:
        return self in (JobStatus.DONE, JobStatus.FAILED, JobStatus.CANCELLED)


class OrderingPolicy(enum.StrEnum):
    """What a permanently failed head job does to the rest of its ordering key."""

    BLOCK = "block"
    CONTINUE = "continue"


class RetentionMode(enum.StrEnum):
    """What retention does with a finished job past its queue's retention."""

    DELETE = "delete"
    #: Move it to ``<schema>.job_archive``, which has a retention of its own.
    ARCHIVE = "archive"


class RenewalBusy(enum.Enum):
    """A batch renewal's third answer, beside a new lease_until (renewed) and None (lost)."""

    BUSY = "busy"


#: Per claim of a batch renewal: the job's row is locked by another transaction right
#: now and the lease is still live; nothing changed. Renew again shortly.
RENEWAL_BUSY = RenewalBusy.BUSY


@dataclass(frozen=True, slots=True)
class Claim:
    """One claimed job: the proof of ownership every later write must show."""

    job_id: int
    queue: str
    payload: Any
    lease_version: int
    attempts: int
    max_attempts: int
    key: str | None
    seq: int | None
    lease_until: datetime
    lease_seconds: float
    idempotency_key: str
    #: This claim took over an expired lease (crash recovery).
    recovered: bool = False
    #: When the job became claimable, by the database's clock: its ``available_at``,
    #: or for a recovered claim the end of the expired lease.
    ready_at: datetime | None = None
    #: When it was claimed, by the database's clock.
    claimed_at: datetime | None = None
    #: The producer's trace context (the ``otel`` extra), which the worker's
    #: ``process`` span continues; None when the enqueue was not traced.
    trace_context: dict[str, str] | None = field(default=None, compare=False, repr=False)
    #: The job's own time limit (``enqueue(timeout=...)``), which overrides its
    #: task's; None: the task's.
    timeout: float | None = None
    #: The job's group (``enqueue(group=...)``): a tenant, a customer; None: ungrouped.
    group: str | None = None

    @property
    def wait_seconds(self) -> float | None:
        """How long the job waited, ready but unclaimed (database times)."""
        if self.ready_at is None or self.claimed_at is None:
            return None
        return max((self.claimed_at - self.ready_at).total_seconds(), 0.0)

    @property
    def last_attempt(self) -> bool:
        return self.attempts >= self.max_attempts


class Claims(list[Claim]):
    """What ``claim`` returns, in claim order: a ``list`` of claims, which also
    says whether one of the queue's limits (``max_running``, ``rate_limit``,
    their per-group twins) held the claim back (``held_back``), and if a rate
    window did, in how many seconds it has room again (``retry_in``; None:
    when a running job of the queue ends)."""

    held_back: bool
    retry_in: float | None

    def __init__(
        self,
        claims: Iterable[Claim] = (),
        *,
        held_back: bool = False,
        retry_in: float | None = None,
    ) -> None:
        super().__init__(claims)
        self.held_back = held_back
        self.retry_in = retry_in


@dataclass(frozen=True, slots=True)
class Job:
    """A job row as operators see it."""

    job_id: int
    queue: str
    payload: Any
    payload_bytes: int
    status: JobStatus
    priority: int
    available_at: datetime
    lease_until: datetime | None
    lease_version: int
    attempts: int
    max_attempts: int
    key: str | None
    seq: int | None
    idempotency_key: str
    last_error: str | None
    history: tuple[dict[str, Any], ...]
    created_at: datetime
    claimed_at: datetime | None
    finished_at: datetime | None
    #: Seconds left on a running job's lease by the database's clock (negative once
    #: expired, awaiting recovery); None unless running. Read, not stored: left
    #: out of comparisons, like ``ahead``.
    lease_remaining: float | None = field(default=None, compare=False)
    #: ``get()`` only: how many unfinished jobs of its ordering key come before it
    #: (0: it is the key's head); None without a key or once finished.
    ahead: int | None = field(default=None, compare=False)
    #: Its unique key (``enqueue(unique_key=...)``), kept after it lets go of it.
    unique_key: str | None = None
    #: Its own timeout (``enqueue(timeout=...)``); None: its task's.
    timeout: float | None = None
    #: Its group (``enqueue(group=...)``); None: ungrouped.
    group: str | None = None
    #: ``get()`` only: the failed job of its ordering key that holds this queued
    #: job back (the key's earliest, before it, under the ``block`` policy) until
    #: it is replayed or skipped; None otherwise.
    blocked_by: int | None = field(default=None, compare=False)


@dataclass(frozen=True, slots=True)
class JobPage:
    """One page of ``find_jobs``: newest first; pass ``next_before`` for the next."""

    jobs: tuple[Job, ...]
    #: The ``before`` of the next (older) page; None when this is the last.
    next_before: int | None
    #: The search reached the edge of its window (the newest ``window`` jobs; of
    #: failed jobs, the newest ``window`` older failures of each queue): older
    #: jobs were not searched.
    window_end: bool = False
    #: The newest job id of the window searched (None: no job at all). Pass it back
    #: as ``window_top`` with ``next_before``: the next page searches the same window,
    #: not one that jobs enqueued meanwhile moved up past the jobs not shown yet.
    window_top: int | None = None


@dataclass(frozen=True, slots=True)
class FailedGroup:
    """Failed jobs of one queue that ended with the same error text."""

    queue: str
    #: Its first 300 characters; None for the jobs without one (or an empty one).
    error: str | None
    count: int
    newest_job_id: int
    newest_at: datetime | None


@dataclass(frozen=True, slots=True)
class FailedSummary:
    groups: tuple[FailedGroup, ...]
    #: Failed jobs read to build the groups; ``capped``: there are more than that.
    scanned: int
    capped: bool


@dataclass(frozen=True, slots=True)
class BlockedKey:
    """An ordering key held by a failed head under the ``block`` policy."""

    queue: str
    key: str
    head_job_id: int
    head_error: str | None
    failed_at: datetime | None
    #: Unfinished jobs waiting behind the head (counted up to a cap: ``waiting_capped``).
    waiting: int
    waiting_capped: bool
    #: The head's lease_version as read: ``replay_many(lease_versions=)`` and
    #: ``cancel(lease_version=)`` then leave it alone if it was replayed since.
    head_lease_version: int | None = None


@dataclass(frozen=True, slots=True)
class ActivityMinute:
    start: datetime
    done: int
    failed: int


@dataclass(frozen=True, slots=True)
class QueueActivity:
    """A queue's finished jobs per minute (oldest first, every minute present) and
    the durations (claim to finish, seconds) of its newest 1,000 jobs done in that time."""

    queue: str
    per_minute: tuple[ActivityMinute, ...]
    p50: float | None
    p95: float | None
    p99: float | None
    #: Only the newest finished jobs were read (a busy queue): the counts are a floor.
    sampled: bool


@dataclass(frozen=True, slots=True)
class AuditEntry:
    """One operator action: who, what, when, which jobs."""

    audit_id: int
    at: datetime
    #: Who the caller said it was (the CLI: ``cli:<OS user>``; the dashboard: its
    #: user); not verified.
    actor: str
    action: str
    queue: str | None
    job_ids: tuple[int, ...]
    detail: dict[str, Any]
    #: The database role the server authenticated for the session that wrote the
    #: row (``session_user``); None for rows older than migration 0024.
    db_role: str | None = None


@dataclass(frozen=True, slots=True)
class QueueSettings:
    name: str
    lease: float
    max_attempts: int
    backoff_base: float
    backoff_cap: float
    ordering_policy: OrderingPolicy
    max_queued_jobs: int | None
    max_queued_bytes: int | None
    max_payload_bytes: int | None
    paused: bool
    backlog_jobs: int
    backlog_bytes: int
    #: Seconds finished jobs are kept, per finished state (None: forever).
    retain_done: float | None = 86400.0
    retain_cancelled: float | None = 7 * 86400.0
    retain_failed: float | None = 30 * 86400.0
    retention_mode: RetentionMode = RetentionMode.DELETE
    #: Seconds archived jobs stay in the archive (None: forever).
    retain_archived: float | None = 90 * 86400.0
    #: At most this many running jobs (live leases) across all workers (None: no limit).
    max_running: int | None = None
    #: At most this many running jobs per group (None: no limit).
    max_running_per_group: int | None = None
    #: At most (starts, seconds): this many job starts in any window of that many
    #: seconds, across all workers (None: no limit).
    rate_limit: tuple[int, float] | None = None
    #: The same, per group.
    rate_limit_per_group: tuple[int, float] | None = None


@dataclass(frozen=True, slots=True)
class QueueStats:
    """One queue's numbers, read without walking its finished rows.

    ``counts`` of queued and running jobs, ``queued_bytes``, ``oldest_ready_age``
    (seconds since the oldest job a worker could claim became ready; a key's
    waiting jobs are not ready; None when none is, or the queue is paused) and
    ``expired_leases`` are exact. The finished
    counts of a large job table are estimates: ``estimated`` names them.
    """

    queue: str
    counts: dict[JobStatus, int]
    queued_bytes: int
    oldest_ready_age: float | None
    expired_leases: int
    paused: bool
    #: The statuses whose count is an estimate (empty: every count is exact).
    estimated: frozenset[JobStatus] = frozenset()

    @property
    def queued(self) -> int:
        return self.counts[JobStatus.QUEUED]

    @property
    def running(self) -> int:
        return self.counts[JobStatus.RUNNING]

    @property
    def failed(self) -> int:
        return self.counts[JobStatus.FAILED]


@dataclass(frozen=True, slots=True)
class ReapResult:
    """What one reaper pass moved to ``failed``."""

    exhausted_queued: tuple[int, ...] = field(default=())
    expired_running: tuple[int, ...] = field(default=())
    #: How many of them each queue had.
    by_queue: Mapping[str, int] = field(default_factory=dict)

    @property
    def failed(self) -> tuple[int, ...]:
        return tuple(sorted(self.exhausted_queued + self.expired_running))

    def __len__(self) -> int:
        return len(self.exhausted_queued) + len(self.expired_running)


#: Jobs per (queue, state).
PruneCounts = Mapping[tuple[str, JobStatus], int]


@dataclass(frozen=True, slots=True)
class PruneResult:
    """What a prune removed per (queue, state), or with ``dry_run`` what it would:
    ``deleted`` and ``archived`` (moved to the archive) left the job table,
    ``expired`` left the archive (its own retention)."""

    deleted: PruneCounts = field(default_factory=dict)
    archived: PruneCounts = field(default_factory=dict)
    expired: PruneCounts = field(default_factory=dict)
    dry_run: bool = False
    #: The last batch was full: more may be due (a prune that stopped at max_batches).
    more: bool = False

    def __len__(self) -> int:
        """Jobs that left the job table."""
        return sum(self.deleted.values()) + sum(self.archived.values())

    def merged(self, later: PruneResult) -> PruneResult:
        """This result and a later batch's, added up."""

        def add(a: PruneCounts, b: PruneCounts) -> dict[tuple[str, JobStatus], int]:
            total = dict(a)
            for key, jobs in b.items():
                total[key] = total.get(key, 0) + jobs
            return total

        return PruneResult(
            deleted=add(self.deleted, later.deleted),
            archived=add(self.archived, later.archived),
            expired=add(self.expired, later.expired),
            dry_run=self.dry_run or later.dry_run,
            more=later.more,
        )


#: How long past due a schedule's tick may be before it counts as stalled: a
#: worker that declares it handles a due tick within about a second.
STALLED_AFTER_SECONDS = 60.0


@dataclass(frozen=True, slots=True)
class ScheduleInfo:
    """A periodic job's bookkeeping (``schedules()``, ``leaseq schedules``)."""

    name: str
    queue: str
    spec: str  # "cron <expression>" or "every <seconds>"
    tz: str
    last_tick: datetime | None  # the latest tick handled (enqueued, skipped or paused)
    next_tick: datetime
    enqueued: int
    skipped: int  # missed ticks older than the catch-up window
    paused_ticks: int  # ticks that came while the queue was paused: no job
    last_job_id: int | None
    queue_paused: bool
    #: Seconds its next tick is past due by the database's clock (0: not due yet).
    #: A running worker that declares it handles a due tick within about a second:
    #: a schedule overdue for longer is declared by no running worker (taken out
    #: of the app, or its workers are down), or its queue is full (BacklogFull).
    overdue_seconds: float = 0.0

    @property
    def stalled(self) -> bool:
        """Overdue by more than a minute (``STALLED_AFTER_SECONDS``): no running
        worker declares it, or its queue is full. A worker that declares it looks
        twice a second."""
        return self.overdue_seconds > STALLED_AFTER_SECONDS
