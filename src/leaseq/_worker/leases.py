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

Both loops run on the event loop, which an ``async def`` handler that blocks
(a ``time.sleep``, a blocking client) stops for as long as it blocks: no
renewal goes out, and no deadline is kept. The handlers in threads (and their
child processes) run on meanwhile, and their leases end in the database. So
the deadlines are also watched from a thread of their own
(:meth:`LeaseKeeper.watch_deadlines_from_a_thread`): past its deadline an
attempt's ``job.lost`` is set there, at its time, whatever the event loop
does; the loop counts and logs the loss once it runs again.
"""

from __future__ import annotations

import asyncio
import math
import threading
import time
from collections.abc import Callable, Sequence

from .._async_client import AsyncQueue
from .._errors import LeaseqError, TransientError
from .._lends import noting_first_lend
from .._logs import get_logger
from .._types import RENEWAL_BUSY, JobStatus
from .._waiting import wait_for_event, within
from .outage import Outage
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
        outage: Outage | None = None,
    ) -> None:
        self._outage = outage or Outage()
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
        # A renewal that does not answer by half the time left to the first
        # deadline it keeps is given up, and sent again at the next tick on a new
        # connection: one whose flow died silently (a NAT or load balancer
        # failover) would hold it until the kernel gives up (the TCP user
        # timeout, 30 s), every lease past its deadline meanwhile, the database
        # there all along.
        answer_by = (min(a.deadline for a in due) - sent) / 2
        try:
            # The renewed leases run from no earlier than the connection's lend,
            # after any wait for one (the database away: _lends).
            with noting_first_lend() as lent:
                results = await within(
                    self._queue.renew_many([r.claim for r in due]),
                    max(answer_by, MIN_RENEWAL_WAIT),
                )
        except (TransientError, TimeoutError) as exc:
            self._stats.database_errors += 1
            self._outage.failed("lease renewals", exc)
            return  # the deadlines stand; the next tick tries again
        self._outage.answered()
        refused: list[Attempt] = []
        for attempt, (_, until) in zip(due, results, strict=True):
            if until is RENEWAL_BUSY:
                self._stats.renewals_busy += 1  # locked elsewhere right now: next tick
            elif until is not None:
                attempt.lease_from = max(attempt.lease_from, lent.at or sent)
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
                if not _watched(attempt):
                    continue
                if now >= attempt.deadline:
                    self._attempts.lose(attempt, _PAST_DEADLINE)
                else:
                    upcoming.append(attempt.deadline)
            # Never longer than a second: a renewal may have moved a deadline later only.
            wake_at = min([*upcoming, now + 1.0])
            self._deadlines_sleep_until = wake_at
            try:
                await wait_for_event(self._deadline_wakeup, wake_at - now)
            finally:
                self._deadlines_sleep_until = -math.inf

    def watch_deadlines_from_a_thread(self) -> Callable[[], None]:
        """Keep the deadlines from a daemon thread too (see the module); returns
        what stops it. It only tells handlers (``job.lost``): the loss itself
        (counted, logged, an async handler cancelled) is the event loop's."""
        loop = asyncio.get_running_loop()
        stop = threading.Event()
        thread = threading.Thread(
            target=self._watch_from_a_thread,
            args=(loop, stop),
            name="leaseq-deadlines",
            daemon=True,
        )
        thread.start()
        return stop.set

    def _watch_from_a_thread(self, loop: asyncio.AbstractEventLoop, stop: threading.Event) -> None:
        wait = _THREAD_WAIT_MAX
        while not stop.wait(wait):
            now = time.monotonic()
            upcoming = now + _THREAD_WAIT_MAX
            for attempt in self._attempts:  # (a snapshot: one C-level copy)
                if not _watched(attempt):
                    continue
                if now < attempt.deadline:
                    upcoming = min(upcoming, attempt.deadline)
                    continue
                if attempt.context.lost.is_set():
                    continue  # told already (the loop's watch, a timeout): nothing to add
                attempt.context.mark_lost(_PAST_DEADLINE)
                try:
                    loop.call_soon_threadsafe(self._lost_past_deadline, attempt)
                except RuntimeError:  # the loop is closed: the worker is gone
                    return
            wait = min(max(upcoming - time.monotonic(), _THREAD_WAIT_MIN), _THREAD_WAIT_MAX)

    def _lost_past_deadline(self, attempt: Attempt) -> None:
        """On the loop: an attempt the thread told is lost (unless its outcome went
        out meanwhile: the fence has the last word on that one)."""
        if _watched(attempt):
            self._attempts.lose(attempt, _PAST_DEADLINE)

    def _tick(self) -> float:
        shortest = min((a.claim.lease_seconds for a in self._attempts), default=60.0)
        return _renewal_tick(shortest, self._renew_fraction)


#: The least time a renewal is given to answer (for leases of a few milliseconds).
MIN_RENEWAL_WAIT = 0.05
#: Why an attempt past its local deadline is lost.
_PAST_DEADLINE = "no renewal was confirmed before its local deadline"
#: How long the deadlines' thread sleeps at most (it wakes at the next deadline
#: otherwise); and at least, for leases of a few milliseconds.
_THREAD_WAIT_MAX = 0.25
_THREAD_WAIT_MIN = 0.02


def _watched(attempt: Attempt) -> bool:
    """Whether an attempt is still to be told at its deadline: not one whose
    handler has returned (nothing left to tell), nor one whose fenced completion
    is on its way to commit (the database says whether the lease still held,
    LeaseLost if not, and telling the handler now changes nothing it does)."""
    return _kept(attempt) and not attempt.acknowledging and not attempt.context.completing


def _renewal_tick(lease_seconds: float, renew_fraction: float) -> float:
    """How long the renewal loop sleeps while it keeps a lease this long: a quarter
    of the time until its renewal is due, between 50 ms and a second."""
    return min(max(lease_seconds * renew_fraction / 4, 0.05), 1.0)


def _kept(attempt: Attempt) -> bool:
    """Whether this attempt still needs its lease: not lost, not completed by its
    handler, its outcome not recorded yet (a settled attempt's after hooks may
    still run, beside a new claim of its job: never renewed in the same batch)."""
    return not attempt.lost and not attempt.context.completed and not attempt.settled
