"""Keeping the leases of running attempts: batched renewals and a local deadline per attempt.

Two loops, because a renewal may hang (a partition: the statement neither
succeeds nor fails until the connection is declared dead) and the deadlines must
still be kept meanwhile:

* ``renew_forever`` renews every lease due, in one batch statement, on the
  worker's own connection (never one a handler's transaction holds). A row
  locked by another transaction comes back busy and is tried again next tick;
  it never makes the other leases of the batch wait.
* ``watch_deadlines`` touches no database. Each attempt has a deadline on the
  monotonic clock: the time just before its claim or last confirmed renewal
  was sent, plus its lease, minus a margin. Past it, the attempt is lost: the
  handler is told and its result is never acknowledged, before the database
  would let another worker reclaim the job.

The worker starts each loop as a service of its own (``heartbeat`` and
``deadlines``), so a crash of either stops the worker loudly.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Sequence

from .._async_client import AsyncQueue
from .._errors import LeaseqError, TransientError
from .._logs import get_logger
from .._types import RENEWAL_BUSY, JobStatus
from .._waiting import wait_for_event
from .registry import AttemptRegistry
from .state import Attempt, WorkerStats

log = get_logger("leaseq.worker")


class LeaseKeeper:
    """Keeps the leases of the registry's attempts; loses those it cannot keep."""

    def __init__(
        self,
        queue: AsyncQueue,
        attempts: AttemptRegistry,
        *,
        renew_fraction: float,
        stats: WorkerStats,
    ) -> None:
        self._queue = queue
        self._attempts = attempts
        self._renew_fraction = renew_fraction
        self._stats = stats
        self._renewal_wakeup = asyncio.Event()
        self._deadline_wakeup = asyncio.Event()
        # When each loop wakes up next by itself (monotonic; -inf while it is not
        # asleep: it looks at every attempt before it sleeps again).
        self._renewals_sleep_until = -math.inf
        self._deadlines_sleep_until = -math.inf

    def attempts_started(self, attempts: Sequence[Attempt]) -> None:
        """New attempts: wake a loop only if one of them needs it before it wakes
        up by itself (a lease shorter than any it keeps), not on every claim (two
        loop turns over every attempt per claim: ~5% of a busy worker's CPU)."""
        if not attempts:
            return
        shortest = min(a.claim.lease_seconds for a in attempts)
        if time.monotonic() + _renewal_tick(shortest, self._renew_fraction) < (
            self._renewals_sleep_until
        ):
            self._renewal_wakeup.set()
        if min(a.deadline for a in attempts) < self._deadlines_sleep_until:
            self._deadline_wakeup.set()

    def check_now(self, job_id: int) -> None:
        """Renew this job's lease at once: a notification said it may be gone (an
        operator cancelled the job), and only the database can say for sure."""
        for attempt in self._attempts:
            if attempt.claim.job_id == job_id:
                attempt.check_now = True
                self._renewal_wakeup.set()

    async def renew_forever(self) -> None:
        while True:
            now = time.monotonic()
            due = [
                a for a in self._attempts if _kept(a) and a.renewal_due(now, self._renew_fraction)
            ]
            if due:
                await self._renew(due)
            tick = self._tick()
            self._renewals_sleep_until = time.monotonic() + tick
            try:
                await wait_for_event(self._renewal_wakeup, tick)
            finally:
                self._renewals_sleep_until = -math.inf

    async def _renew(self, due: list[Attempt]) -> None:
        sent = time.monotonic()
        for attempt in due:
            attempt.check_now = False
        try:
            results = await self._queue.renew_many([r.claim for r in due])
        except TransientError as exc:
            self._stats.database_errors += 1
            log.warning("lease renewal failed (%s); retrying", exc)
            return  # the deadlines stand; the next tick tries again
        refused: list[Attempt] = []
        for attempt, (_, until) in zip(due, results, strict=True):
            if until is RENEWAL_BUSY:
                self._stats.renewals_busy += 1  # locked elsewhere right now: next tick
            elif until is not None:
                attempt.lease_from = max(attempt.lease_from, sent)
            elif _kept(attempt) and not attempt.acknowledging:
                # (an acknowledged job is no longer running: its own outcome tells)
                refused.append(attempt)
        for attempt in refused:
            if await self._completed_by_its_handler(attempt):
                attempt.context.mark_completed()  # nothing left to renew
            elif _kept(attempt) and not attempt.acknowledging:
                self._attempts.lose(attempt, "the lease could not be renewed")

    async def _completed_by_its_handler(self, attempt: Attempt) -> bool:
        """Whether a refused renewal's job is done under this very claim: its
        handler's own transaction (``job.transaction()``, an ORM session's)
        committed the completion, and the worker has not heard yet (between the
        commit and ``mark_completed()``; from a child process, until it says so).
        That job is done, not lost. Asked only of refused renewals."""
        if attempt.context.completed:
            return True
        try:
            job = await self._queue.get(attempt.claim.job_id)
        except LeaseqError:  # gone, or the database away: lost, as the fence says
            return False
        return job.status is JobStatus.DONE and job.lease_version == attempt.claim.lease_version

    async def watch_deadlines(self) -> None:
        while True:
            now = time.monotonic()
            upcoming: list[float] = []
            for attempt in self._attempts:
                if not _kept(attempt) or attempt.acknowledging:
                    continue  # nothing left to tell a handler that has returned
                if attempt.context.completing:
                    # Its fenced completion is on its way to commit: the database
                    # says whether the lease still held (LeaseLost if not), and
                    # telling the handler now changes nothing it does.
                    continue
                if now >= attempt.deadline:
                    self._attempts.lose(
                        attempt, "no renewal was confirmed before its local deadline"
                    )
                else:
                    upcoming.append(attempt.deadline)
            # Never longer than a second: a renewal may have moved a deadline later only.
            wake_at = min([*upcoming, now + 1.0])
            self._deadlines_sleep_until = wake_at
            try:
                await wait_for_event(self._deadline_wakeup, wake_at - now)
            finally:
                self._deadlines_sleep_until = -math.inf

    def _tick(self) -> float:
        shortest = min((a.claim.lease_seconds for a in self._attempts), default=60.0)
        return _renewal_tick(shortest, self._renew_fraction)


def _renewal_tick(lease_seconds: float, renew_fraction: float) -> float:
    """How long the renewal loop sleeps while it keeps a lease this long: a quarter
    of the time until its renewal is due, between 50 ms and a second."""
    return min(max(lease_seconds * renew_fraction / 4, 0.05), 1.0)


def _kept(attempt: Attempt) -> bool:
    """Whether this attempt still needs its lease: not lost, not completed by its
    handler, its outcome not recorded yet (a settled attempt's after hooks may
    still run, beside a new claim of its job: never renewed in the same batch)."""
    return not attempt.lost and not attempt.context.completed and not attempt.settled
