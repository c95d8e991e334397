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
import time

from .._async_client import AsyncQueue
from .._errors import TransientError
from .._logs import get_logger
from .._types import RENEWAL_BUSY
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

    def attempt_started(self) -> None:
        """A new attempt may need its first renewal, or hit its deadline, sooner."""
        self._renewal_wakeup.set()
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
            await wait_for_event(self._renewal_wakeup, self._tick())

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
        for attempt, (_, until) in zip(due, results, strict=True):
            if until is RENEWAL_BUSY:
                self._stats.renewals_busy += 1  # locked elsewhere right now: next tick
            elif until is not None:
                attempt.lease_from = max(attempt.lease_from, sent)
            elif _kept(attempt) and not attempt.acknowledging:
                # (an acknowledged job is no longer running: its own outcome tells)
                self._attempts.lose(attempt, "the lease could not be renewed")

    async def watch_deadlines(self) -> None:
        while True:
            now = time.monotonic()
            upcoming: list[float] = []
            for attempt in self._attempts:
                if not _kept(attempt) or attempt.acknowledging:
                    continue  # nothing left to tell a handler that has returned
                if now >= attempt.deadline:
                    self._attempts.lose(
                        attempt, "no renewal was confirmed before its local deadline"
                    )
                else:
                    upcoming.append(attempt.deadline)
            # Never longer than a second: a renewal may have moved a deadline later only.
            await wait_for_event(self._deadline_wakeup, min([*upcoming, now + 1.0]) - now)

    def _tick(self) -> float:
        shortest = min((a.claim.lease_seconds for a in self._attempts), default=60.0)
        return min(max(shortest * self._renew_fraction / 4, 0.05), 1.0)


def _kept(attempt: Attempt) -> bool:
    """Whether this attempt still needs its lease: not lost, not completed by its handler."""
    return not attempt.lost and not attempt.context.completed
