"""The claim loop: claims for the free slots, and starts an attempt for each job.

At most as many jobs as there are free slots (:mod:`.registry`), in one
statement per queue, round robin, from the queues that may have work
(:mod:`.hints`); then it sleeps until a NOTIFY, a freed slot or a jittered
poll. A queue whose claim came back short is entered as waited on, so that its
enqueues notify (:mod:`.wake_entries`). Before its first claim it checks that
the schema has every migration of this code (``_migrate.require_current``). At a
stop, the claim in flight gets the grace, then is cancelled, and what a claim
returns after the stop is given back unstarted.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Coroutine, Mapping
from typing import Any, TypeVar

from .. import _tracing
from .._async_client import AsyncQueue
from .._errors import InvalidDatabaseURL, TransientError
from .._lends import noting_first_lend
from .._logs import get_logger
from .._metrics import Metrics
from .._sync_client import Queue
from .._types import Claim, Claims
from .._waiting import cancelling
from .app import Task
from .attempt import AttemptRunner
from .context import JobContext
from .hints import WorkHints
from .leases import LeaseKeeper
from .outage import Outage
from .outcomes import ACKNOWLEDGEMENT_WAIT
from .registry import AttemptRegistry
from .state import WorkerStats
from .wake_entries import WakeEntries

log = get_logger("leaseq.worker")

T = TypeVar("T")


class ClaimLoop:
    """One worker's claims; its parts are the worker's (``Worker.run`` makes it)."""

    def __init__(
        self,
        *,
        client: AsyncQueue,
        handlers: Queue,
        handlers_async: AsyncQueue,
        tasks: Mapping[str, Task],
        queues: list[str],
        lease: float | None,
        poll_interval: float,
        burst: bool,
        stopping: asyncio.Event,
        attempts: AttemptRegistry,
        hints: WorkHints,
        wake: WakeEntries,
        runner: AttemptRunner,
        leases: LeaseKeeper,
        stats: WorkerStats,
        metrics: Metrics | None,
        outage: Outage | None = None,
    ) -> None:
        self._outage = outage or Outage()
        self._client = client
        self._handlers = handlers
        self._handlers_async = handlers_async
        self._tasks = tasks
        self._queues = queues
        self._lease = lease
        self._poll_interval = poll_interval
        self._burst = burst
        self._stopping = stopping
        self._attempts = attempts
        self._hints = hints
        self._wake = wake
        self._runner = runner
        self._leases = leases
        self._stats = stats
        self._metrics = metrics
        #: The claim statement in flight, if any (cancelled past the grace of a stop).
        self._claiming: asyncio.Future[Any] | None = None
        #: Whether the schema has every migration of this code (checked before a claim).
        self._schema_checked = False

    def abandon_after(self, grace: float) -> None:
        """At a stop: the claim in flight, if any, is cancelled if it has not returned
        within ``grace`` (thread-safe: a stop may come from another thread)."""
        claiming = self._claiming
        if claiming is not None:
            # It may wait on the database for long (a lock held by a migration, a
            # server away): it gets the grace, as running jobs do.
            loop = claiming.get_loop()
            loop.call_soon_threadsafe(loop.call_later, grace, _abandon, claiming, grace)

    async def run(self) -> None:
        """Claim for the free slots until the stop (a burst: until nothing is left)."""
        start = 0
        swept = False  # burst: every queue was asked since the last job was claimed
        while not self._stopping.is_set():
            free = self._attempts.free_slots()
            if free <= 0:
                await self._attempts.sleep_until_woken(None)
                continue
            order = self._queues[start:] + self._queues[:start]
            start = (start + 1) % len(self._queues)
            asking = self._hints.to_ask(order)
            idle = not asking and not self._attempts and not self._hints.awaiting_room()
            if self._burst and idle:
                if swept:
                    return  # nothing claimable now, nothing running
                # One more claim of every queue first: a job a handler enqueued,
                # or one announced by no one (a burst worker does not listen),
                # is found by no hint.
                swept = True
                self._hints.may_have_work()
                continue
            if not asking:  # nothing to claim until a hint or the poll (.hints)
                await self._attempts.sleep_until_woken(self._hints.until_poll())
                continue
            try:
                if not self._schema_checked:  # here, where a database away is retried
                    # NotMigrated unless the schema has every migration of this code.
                    # It may wait on a lock (a deploy's ``leaseq migrate``).
                    checked = await self._abandonable(self._client._require_migrated())
                    if isinstance(checked, Abandoned):
                        return
                    self._schema_checked = True
                for name, generation in asking:
                    claims = await self._claim_queue(name, generation, free)
                    if claims is None:
                        return  # abandoned at the stop
                    if claims:
                        swept = False
                    free -= len(claims)
                    if free <= 0 or self._stopping.is_set():
                        break
            except InvalidDatabaseURL:
                raise  # a setup error: no retry can connect with it
            except TransientError as exc:
                self._stats.database_errors += 1
                self._outage.failed("claims", exc)
                await self._attempts.sleep_until_woken(
                    self._poll_interval * random.uniform(0.5, 1.5)
                )

    async def _claim_queue(self, name: str, generation: int, free: int) -> Claims | None:
        """One queue's claim, then its hints and wake-up entry; None if a statement
        was abandoned at the stop."""
        settling = self._wake.settling(name)
        if settling and isinstance(
            await self._abandonable(self._wake.check_fence(name)), Abandoned
        ):
            return None
        claims = await self._claim(name, free)
        short = len(claims) < free
        if short:
            self._hints.came_back_short(name, generation)
        if claims.retry_in is not None:
            self._hints.ask_again_in(name, claims.retry_in)
        if not self._stopping.is_set():
            again = await self._wake_entry(name, short)
            if isinstance(again, Abandoned):
                return None
            if again is not None:
                self._hints.ask_again_in(name, again)
        return claims

    async def _wake_entry(self, queue: str, short: bool) -> float | Abandoned | None:
        """After a claim: enter or leave the queue as waited on (.wake_entries); when
        to ask it again whatever the hints say (None: as they say)."""
        if self._wake.must_write(queue, short):
            return await self._abandonable(self._wake.write(queue, short))
        return self._wake.claimed(queue, short)

    async def _abandonable(self, statement: Coroutine[Any, Any, T]) -> T | Abandoned:
        """Run one of the loop's other statements as a claim runs: a stop gives it
        the grace, then cancels it (Abandoned). After the stop none is sent: the
        stop cancels only the statement in flight when it came, and one sent
        later (after the check that was in flight, say) could wait on a lock for
        as long as that lasts, holding the stop up."""
        if self._stopping.is_set():
            statement.close()
            return Abandoned()
        running = asyncio.ensure_future(statement)
        self._claiming = running
        try:
            return await running
        except asyncio.CancelledError:
            if cancelling():
                raise  # the worker's own task: a second signal, or its caller
            return Abandoned()
        finally:
            self._claiming = None

    async def _release_unstarted(self, claims: Claims) -> None:
        try:  # bounded as the stop's other releases: the database may be away
            results = await asyncio.wait_for(
                self._client.release_many(claims), ACKNOWLEDGEMENT_WAIT
            )
        except (TransientError, TimeoutError) as exc:
            log.warning(
                "%d jobs claimed as the worker stopped could not be given back (%s); their "
                "leases will expire and they will run again",
                len(claims),
                exc,
            )
            return
        released = [claim for claim, given_back in results if given_back]
        self._stats.released += len(released)
        if self._metrics is not None:
            for claim in released:
                self._metrics.queue(claim.queue).finished["released"].inc()
        log.info("gave back %d jobs whose claim returned after the stop", len(released))

    async def _claim(self, name: str, limit: int) -> Claims:
        """Claim up to ``limit`` jobs of one queue and start an attempt for each."""
        if self._stopping.is_set():  # (as _abandonable's: nothing is sent after the stop)
            return Claims([])
        task = self._tasks[name]
        started = time.perf_counter()
        sent = time.monotonic()  # the leases run from no earlier than this
        with noting_first_lend() as lent:  # ... nor than this, after any wait for a connection
            claiming = asyncio.ensure_future(
                self._client.claim(name, limit=limit, lease=task.lease or self._lease)
            )
        self._claiming = claiming
        try:
            claims = await claiming
        except asyncio.CancelledError:
            if cancelling():
                raise  # the worker's own task: a second signal, or its caller
            return Claims([])  # abandoned at the stop (abandon_after)
        finally:
            self._claiming = None
        elapsed = time.perf_counter() - started
        self._outage.answered()
        self._stats.claim_statements += 1
        self._stats.claim_seconds += elapsed
        self._stats.claimed += len(claims)
        if self._metrics is not None:
            _count_claim(self._metrics, name, elapsed, claims)
        if self._stopping.is_set() and claims:
            # It returned after the stop: nothing of it starts. Given back at once,
            # the attempt not counted (its lease would otherwise run out here, the
            # attempt counted, after a stop that waited on this very claim).
            await self._release_unstarted(claims)
            return Claims([])
        started_now = []
        traced = _tracing.active() if claims else False
        for claim in claims:
            context = JobContext(claim, self._handlers, self._handlers_async, task.max_result_bytes)
            attempt = self._attempts.add(
                claim, context, lease_from=lent.at or sent, cancellable=task.is_async
            )
            self._runner.start(attempt, task, traced=traced)
            started_now.append(attempt)
        self._leases.attempts_started(started_now)
        return claims


class Abandoned:
    """A statement of the claim loop cancelled past a stop's grace."""


#: How long a cancelled statement of the claim loop may take to end at a stop
#: before it is cancelled again. psycopg answers a cancellation by asking the
#: server to cancel the query (5 s at most) and then waiting for the query to end
#: (5 s more): with the server silent, 10 s past the grace, on top of the stop's
#: documented bound (the releases' 10 s and the close's 5 s). Cancelled again,
#: it closes the connection at once.
ABANDON_WAIT = 1.0


def _abandon(claiming: asyncio.Future[Any], grace: float) -> None:
    if not claiming.done():
        log.warning(
            "the claim in flight at the stop has not returned within the grace (%gs); cancelled",
            grace,
        )
        # psycopg cancels the statement: it rolls back, claiming nothing (a claim that
        # had committed all the same is given back by the client before it ends).
        claiming.cancel()
        claiming.get_loop().call_later(ABANDON_WAIT, _abandon_for_good, claiming)


def _abandon_for_good(claiming: asyncio.Future[Any]) -> None:
    """The server has not ended the cancelled statement (it does not answer): a
    second cancellation makes psycopg close the connection rather than wait."""
    if not claiming.done():
        claiming.cancel()


def _count_claim(metrics: Metrics, queue: str, elapsed: float, claims: list[Claim]) -> None:
    """One claim call: its time, and per claim a recovered lease and how long it waited."""
    instruments = metrics.queue(queue)
    instruments.claims.inc()
    instruments.claim_duration.observe(elapsed)
    for claim in claims:
        if claim.recovered:
            instruments.recovered.inc()
        wait = claim.wait_seconds
        if wait is not None:
            instruments.job_wait.observe(wait)
