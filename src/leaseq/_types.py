"""Plain values that cross the public API: frozen, no I/O."""

from __future__ import annotations

import enum
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

    @property
    def wait_seconds(self) -> float | None:
        """How long the job waited, ready but unclaimed (database times)."""
        if self.ready_at is None or self.claimed_at is None:
            return None
        return max((self.claimed_at - self.ready_at).total_seconds(), 0.0)

    @property
    def last_attempt(self) -> bool:
        return self.attempts >= self.max_attempts


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


@dataclass(frozen=True, slots=True)
class QueueStats:
    """One queue's numbers, read without walking its finished rows.

    ``counts`` of queued and running jobs, ``queued_bytes``, ``oldest_ready_age``
    (seconds since the oldest job a worker could claim became ready; a key's
    waiting jobs are not ready) and ``expired_leases`` are exact. The finished
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

    @property
    def failed(self) -> tuple[int, ...]:
        return tuple(sorted(self.exhausted_queued + self.expired_running))

    def __len__(self) -> int:
        return len(self.exhausted_queued) + len(self.expired_running)
