"""What the worker keeps about itself (its stats) and about each attempt it runs."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from .._types import Claim
from .context import JobContext

#: The local deadline is this fraction of the lease (at most MAX_LEASE_MARGIN seconds)
#: before the database's: a handler told at its deadline stops before anyone else can
#: reclaim the job.
LEASE_MARGIN_FRACTION = 0.2
MAX_LEASE_MARGIN = 5.0


@dataclass
class WorkerStats:
    """What a worker did; the numbers operators ask for."""

    claimed: int = 0
    completed: int = 0
    retried: int = 0
    failed: int = 0
    released: int = 0
    lost_leases: int = 0
    timeouts: int = 0
    claim_statements: int = 0
    claim_seconds: float = 0.0
    listen_reconnects: int = 0
    database_errors: int = 0
    renewals_busy: int = 0  # a renewal skipped a row locked by another transaction


@dataclass
class Attempt:
    """One attempt this worker runs, from its claim until its outcome is acknowledged."""

    claim: Claim
    context: JobContext
    #: Monotonic time taken just before the claim, or the last confirmed renewal, was
    #: sent: the database's lease runs from a moment no earlier than this.
    lease_from: float
    #: An async handler can be cancelled; a sync handler's thread cannot be stopped.
    cancellable: bool
    task: asyncio.Task[None] | None = None  # runs the handler, then the acknowledgement
    lost: bool = False  # the lease is gone: whatever the handler does is never acknowledged
    acknowledging: bool = False  # the handler returned; its outcome is being flushed
    #: The app's on_success/on_failure hooks run after the outcome: the job's slot
    #: stays taken until they have returned (or the job's timeout has passed).
    hooks_pending: bool = False
    #: Its outcome is acknowledged by the database: only its after hooks may run on.
    settled: bool = False
    #: Told to stop by the worker's own stop (past its grace): whatever the
    #: handler does next, its job is released, its attempt not counted.
    stopping: bool = False
    #: Renew at once, whatever the time: an operator may have cancelled the job
    #: (the notification "!lost <job_id>"); the renewal tells.
    check_now: bool = False

    @property
    def deadline(self) -> float:
        """When this worker stops trusting the lease, unless a renewal was confirmed.

        Read from the monotonic clock only (a worker's wall clock may be far off), with
        a margin for the time it takes to tell the handler and for clock-rate drift.
        """
        lease = self.claim.lease_seconds
        return self.lease_from + lease - min(lease * LEASE_MARGIN_FRACTION, MAX_LEASE_MARGIN)

    def renewal_due(self, now: float, fraction: float) -> bool:
        return self.check_now or now - self.lease_from >= self.claim.lease_seconds * fraction
