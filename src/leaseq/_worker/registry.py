"""The attempts a worker runs: who holds a slot, which attempt is a job's newest, losing one.

Attempts are keyed by claim, ``(job_id, lease_version)``, not by job: this worker
may reclaim a job whose lease it lost (it expired while the handler ran on), and
then the old attempt is lost and the new one runs beside it until the old one's
handler returns.

The registry also holds the wake-up the claim loop sleeps on: a freed slot, a
notification, a stop request all set it.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator

from .._logs import get_logger, job_fields
from .._metrics import Metrics
from .._types import Claim
from .._waiting import wait_for_event
from .context import JobContext
from .state import Attempt, WorkerStats

log = get_logger("leaseq.worker")


def acknowledgement_backlog(concurrency: int) -> int:
    """How many returned attempts may await their acknowledgement at once.

    At least a few even at concurrency 1: each acknowledgement takes a round
    trip, and the next handler often returns before the last one's commit is
    back; with room for one only, the claim loop waited for it on every job.

    Two slots' worth: the flush in flight, and the batch that gathers behind
    it. With room for one batch only, a claim whose jobs all returned while
    the previous batch's flush was still committing waited for that commit
    before it could claim again: the claim queued behind the acknowledgement
    on every cycle (concurrency 10, no-op handlers: 6,000 jobs/s against
    6,600 with two batches; bench/README.md).
    """
    return max(2 * concurrency, 8)


#: How long a stopping worker waits for attempt tasks it cancelled a last time.
#: A handler that swallows cancellation would otherwise keep the worker for ever.
STRAGGLER_WAIT = 1.0
#: How long it waits for those it cancelled a second time (_cancelled_again).
AGAIN_WAIT = 0.2


class AttemptRegistry:
    def __init__(self, concurrency: int, stats: WorkerStats, metrics: Metrics | None) -> None:
        self._concurrency = concurrency
        self._stats = stats
        self._metrics = metrics
        self._by_claim: dict[tuple[int, int], Attempt] = {}
        self._newest: dict[int, Attempt] = {}  # the newest attempt of each job here
        self._wakeup = asyncio.Event()
        #: The worker is past its grace period: an attempt cancelled now is released.
        self.releasing = False

    def __len__(self) -> int:
        return len(self._by_claim)

    def __iter__(self) -> Iterator[Attempt]:
        """A snapshot: attempts may come and go while the caller looks at each."""
        return iter(list(self._by_claim.values()))

    def add(
        self, claim: Claim, context: JobContext, *, lease_from: float, cancellable: bool
    ) -> Attempt:
        stale = self._newest.get(claim.job_id)
        if stale is not None and not stale.settled:
            # (A settled attempt's outcome is recorded: its job was retried or
            # released, and claimed again while its after hooks run. Not a loss.)
            self.lose(stale, "the lease expired and the job was claimed again")
        attempt = Attempt(claim, context, lease_from=lease_from, cancellable=cancellable)
        self._by_claim[(claim.job_id, claim.lease_version)] = attempt
        self._newest[claim.job_id] = attempt
        return attempt

    def handler_returned(self, attempt: Attempt) -> None:
        """Its outcome is on its way to the database: its slot is free for the next claim."""
        attempt.acknowledging = True
        self.wake()

    def finish(self, attempt: Attempt) -> None:
        claim = attempt.claim
        self._by_claim.pop((claim.job_id, claim.lease_version), None)
        if self._newest.get(claim.job_id) is attempt:
            del self._newest[claim.job_id]
        self.wake()

    def running(self) -> int:
        """Attempts whose handler has not returned yet (read by a metrics scrape, from
        another thread: one C-level copy of the values, no iteration over the dict).
        Not one whose outcome is settled either: a handler that completed its job
        through its own transaction has returned, while its after hooks run."""
        return sum(1 for a in list(self._by_claim.values()) if not (a.acknowledging or a.settled))

    def free_slots(self) -> int:
        # A handler that has returned frees its slot at once: its acknowledgement
        # is flushed while the next claim runs (at concurrency 1 the worker would
        # otherwise wait a flush per job: half the rate, bench/worker.py). The
        # attempts awaiting their acknowledgement are capped (acknowledgement_backlog),
        # so a database that stops taking them cannot make the worker hoard. An
        # attempt whose sync thread still runs (timed out, or lost) keeps its slot,
        # and so does one whose after-hooks are still to run.
        freed = sum(1 for a in self._by_claim.values() if a.acknowledging and not a.hooks_pending)
        working = len(self._by_claim) - freed
        held_at_most = self._concurrency + acknowledgement_backlog(self._concurrency)
        return min(self._concurrency - working, held_at_most - len(self._by_claim))

    def lose(self, attempt: Attempt, reason: str, *, returned: bool = False) -> None:
        """The lease is gone: tell the handler, and never acknowledge what it returns
        (``returned``: its handler has returned already; its task is not cancelled)."""
        if attempt.lost:
            return
        attempt.lost = True
        attempt.context.mark_lost(reason)
        self._stats.lost_leases += 1
        if self._metrics is not None:
            self._metrics.queue(attempt.claim.queue).finished["lease_lost"].inc()
        log.warning(
            "job %d (lease version %d): lease lost: %s",
            attempt.claim.job_id,
            attempt.claim.lease_version,
            reason,
            extra=job_fields(attempt.claim, outcome="lease_lost", error=reason),
        )
        # A sync attempt stays until its thread returns (it holds a slot); job.lost tells it.
        if (
            attempt.cancellable
            and attempt.task is not None
            and not attempt.acknowledging
            and not returned
        ):
            attempt.task.cancel()

    async def stop_unrenewed(self, timeout: float, *, now: bool) -> None:
        """The worker's task was cancelled with attempts running, which nothing
        renews any more: stop their handlers and give their jobs back as at a stop
        past its grace (:meth:`release_all`); ``now`` (a second signal): only tell
        them to stop, and leave their jobs to their leases. Nothing to do after a
        stop that gave them back already."""
        if not self._by_claim or self.releasing:
            return
        if now:
            self.abandon_all()
            return
        # In a task of its own: the caller's is being cancelled, and the waits of
        # the releases would take that for theirs (_waiting.cancelling).
        releasing = asyncio.ensure_future(self.release_all(timeout))
        with contextlib.suppress(Exception, asyncio.CancelledError):
            await asyncio.shield(releasing)

    def abandon_all(self) -> None:
        """Exiting now (a second signal): tell every handler still running to stop,
        and leave its job to its lease's expiry. Nothing is waited for."""
        for attempt in list(self._by_claim.values()):
            if not attempt.acknowledging:
                attempt.stopping = True
                attempt.context.mark_lost("worker exiting")
                if attempt.cancellable and attempt.task is not None:
                    attempt.task.cancel()

    async def release_all(self, timeout: float) -> None:
        """Stop every attempt whose handler still runs; each task then releases its job.

        Async handlers first: cancelled, they stop (and clean up) before their release.
        A sync handler's thread cannot be stopped: its job is released while the thread
        runs on; it is a daemon and ends with the process, and job.lost fences it.
        Acknowledged attempts just wait for their flush.

        Waits ``timeout`` seconds at most: with the database away, the releases (and
        flushes) would be retried forever. What is not acknowledged by then is left
        to its lease's expiry, as after a crash; so is an async handler that swallows
        its cancellation (after STRAGGLER_WAIT more), as a sync handler's thread is.
        """
        self.releasing = True
        deadline = time.monotonic() + timeout
        # Attempts of a claim that returned just before the stop may not have
        # started: a task cancelled before its first step never runs its body, so
        # its job would be neither run nor released. One turn of the loop starts them.
        await asyncio.sleep(0)
        left = list(self._by_claim.values())
        deaf: list[Attempt] = []
        for cancellable in (True, False):
            these = [a for a in left if a.task is not None and a.cancellable is cancellable]
            for attempt in these:
                if not attempt.acknowledging and attempt.task is not None:
                    attempt.stopping = True
                    attempt.context.mark_lost("worker shutting down")
                    if cancellable:
                        attempt.task.cancel()
            if cancellable:
                # A cancelled async handler stops at once and its release goes out;
                # one that swallows its cancellation gets a second, then is left to
                # its lease (the releases' wait is for the database, not for it).
                deaf = await self._still_in_their_handlers(these, STRAGGLER_WAIT)
                deaf = await self._cancelled_again(deaf)
            else:
                # A sync handler is told through job.lost. One that stops when told
                # (the README's does) has its job claimable at once; the job of a
                # thread still running a second later waits for the lease it held.
                for attempt in await self._still_in_their_handlers(these, STRAGGLER_WAIT):
                    if attempt.task is not None:
                        attempt.task.cancel()
            waiting = [
                a.task for a in these if a.task is not None and a not in deaf and not a.settled
            ]
            if waiting:
                await asyncio.wait(waiting, timeout=max(deadline - time.monotonic(), 0.0))
        if deaf:
            log.error(
                "%d handlers did not stop when cancelled; left running (their jobs' "
                "leases will expire and they will run again)",
                len(deaf),
            )
        # Jobs whose outcome the database has, still in their on_success/on_failure
        # hooks past the grace: those are not waited for (nothing of the job is).
        in_hooks = [a.task for a in left if a.task is not None and not a.task.done() and a.settled]
        if in_hooks:
            log.warning(
                "%d jobs' after hooks were still running at the stop; cancelled (the jobs' "
                "outcomes are recorded)",
                len(in_hooks),
            )
            for task in in_hooks:
                task.cancel()
            await asyncio.wait(in_hooks, timeout=STRAGGLER_WAIT)
        unsettled = [
            a.task
            for a in left
            if a.task is not None and not a.task.done() and a not in deaf and not a.settled
        ]
        if unsettled:
            log.warning(
                "%d jobs not acknowledged within %gs of the stop (is the database "
                "reachable?); their leases will expire and they will run again",
                len(unsettled),
                timeout,
            )
            for task in unsettled:
                task.cancel()
            await asyncio.wait(unsettled, timeout=STRAGGLER_WAIT)

    async def _cancelled_again(self, attempts: list[Attempt]) -> list[Attempt]:
        """Cancel again the handlers still running a second after their
        cancellation; those that run on (they swallow it) are returned. A handler
        waiting on a query of its own is not deaf: psycopg answers a cancellation
        by asking the server to cancel the query (5 s at most), then waits for
        the query to end (5 s more); with the server silent, the handler ran on
        past its second, blamed for swallowing its cancellation. Cancelled again,
        psycopg closes the connection at once."""
        for attempt in attempts:
            if attempt.task is not None:
                attempt.task.cancel()
        return await self._still_in_their_handlers(attempts, AGAIN_WAIT) if attempts else []

    async def _still_in_their_handlers(
        self, attempts: list[Attempt], timeout: float
    ) -> list[Attempt]:
        """Wait until each attempt's handler has returned (its task done, or its
        outcome on its way), ``timeout`` seconds at most; those that have not."""
        deadline = time.monotonic() + timeout
        while True:
            running = [
                a
                for a in attempts
                if a.task is not None and not a.task.done() and not a.acknowledging
            ]
            remaining = deadline - time.monotonic()
            if not running or remaining <= 0:
                return running
            await self.sleep_until_woken(min(remaining, 0.05))

    def wake(self) -> None:
        self._wakeup.set()

    async def sleep_until_woken(self, timeout: float | None) -> None:
        await wait_for_event(self._wakeup, timeout)
