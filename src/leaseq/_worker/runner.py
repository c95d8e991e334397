"""The worker: claims what it has room for, runs handlers, keeps their leases.

One asyncio loop per process. Async handlers run on it; sync handlers run in
daemon threads (one per slot), so CPU-bound work cannot stop the loop from
renewing leases, and a handler that never returns cannot keep a stopped process
alive. Background services, each on connections of its own so that no handler's
transaction can make it wait:

* the claim loop: claims at most as many jobs as there are free slots, in one
  statement per queue; sleeps until a NOTIFY, a freed slot or a jittered poll;
* the heartbeat and the deadlines (:mod:`.leases`): due leases renewed in one
  fenced batch statement that skips locked rows; each attempt's lease also has a
  local deadline on the monotonic clock. A lease that is lost, or whose deadline
  passes unconfirmed, is lost: the handler is told (cancelled, or ``job.lost``
  set) and its result is never acknowledged;
* outcomes: completions, retries and failures flushed in batches;
* the listener (optional): LISTEN for the schema's channel, re-established
  after every reconnect; polling runs behind it regardless;
* maintenance (optional): the reaper, on whichever worker holds the lock.

An attempt lasts until its handler returns. A sync handler's thread cannot be
stopped, so a timed-out sync attempt keeps its slot and its lease (renewals go
on, ``job.lost`` is set so ``job.transaction()`` refuses) and reports the
timeout only once its thread has returned: nobody else can start the job while
the thread still runs. Shutdown waits for every attempt up to the grace period,
then releases what is left.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import random
import signal
import time
from collections.abc import Sequence

from .._async_client import WORKER_CONNECTIONS, AsyncQueue
from .._config import database_url
from .._errors import InvalidArgument, LeaseLost, TransientError
from .._logs import get_logger
from .._maintenance import Maintenance
from .._retry import Retry, Verdict
from .._sync_client import Queue
from .._types import Claim
from .app import App, Task
from .context import JobContext
from .handlers import TimedOut, run_in_thread, run_on_loop
from .leases import LeaseKeeper
from .listener import listen_for_work
from .outcomes import Answer, Kind, Outcome, Outcomes
from .signals import StopSignals
from .state import Running as _Running
from .state import WorkerStats
from .threads import DaemonThreads

log = get_logger("leaseq.worker")


class Worker:
    """Runs an :class:`App`'s handlers until told to stop."""

    def __init__(
        self,
        app: App,
        *,
        dsn: str | None = None,
        queues: Sequence[str] | None = None,
        concurrency: int = 10,
        lease: float | None = None,
        poll_interval: float = 1.0,
        listen: bool = True,
        listen_dsn: str | None = None,
        renew_fraction: float = 1 / 3,
        shutdown_grace: float = 30.0,
        maintenance: bool = True,
        maintenance_interval: float = 5.0,
    ) -> None:
        if not app.tasks:
            raise InvalidArgument("the app has no tasks")
        unknown = set(queues or ()) - set(app.tasks)
        if unknown:
            raise InvalidArgument(f"no handler for queues: {', '.join(sorted(unknown))}")
        if not 1 <= concurrency <= 10_000:
            raise InvalidArgument("concurrency must be between 1 and 10000")
        if not 0 < renew_fraction < 1:
            raise InvalidArgument("renew_fraction must be between 0 and 1")
        self.app = app
        self.dsn = database_url(dsn or app.dsn)
        self.queues = list(queues or app.tasks)
        self.concurrency = concurrency
        self.lease = lease
        self.poll_interval = poll_interval
        self.listen = listen
        # Through the funnel too, so that its password is redacted wherever it shows.
        self.listen_dsn = database_url(listen_dsn) if listen_dsn else self.dsn
        self.renew_fraction = renew_fraction
        self.shutdown_grace = shutdown_grace
        self.maintenance = maintenance
        self.maintenance_interval = maintenance_interval
        self.stats = WorkerStats()
        # Keyed by claim, not job: this worker may reclaim a job whose lease it lost.
        self._running: dict[tuple[int, int], _Running] = {}
        self._latest: dict[int, _Running] = {}  # the newest attempt of each job here
        self._stopping = asyncio.Event()
        self._wakeup = asyncio.Event()
        self._releasing = False
        self._signals = StopSignals()
        self._main: asyncio.Task[None] | None = None
        self._crashed: BaseException | None = None

    # -- lifecycle ---------------------------------------------------------------

    def request_stop(self) -> None:
        """Stop claiming; running jobs get the grace period, then are released."""
        self._stopping.set()
        self._wakeup.set()

    def _on_signal(self) -> None:
        count = self._signals.received()
        if count == 0:
            log.info("the stop signal again (sent to the group and forwarded): one signal")
        elif count == 1:
            log.info("stopping: finishing running jobs (up to %.0fs)", self.shutdown_grace)
            self.request_stop()
        elif self._main is not None:
            log.warning("second signal: exiting now; unfinished leases will expire")
            self._main.cancel()

    async def run(self, *, install_signal_handlers: bool = False) -> None:
        loop = asyncio.get_running_loop()
        self._main = asyncio.current_task()
        if install_signal_handlers:
            for signum in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(signum, self._on_signal)
        schema = self.app.schema
        # The handlers' pools, behind JobContext.connection()/transaction()/atransaction().
        self._sync = Queue(
            self.dsn,
            schema=schema,
            pool_size=self.concurrency,
            connection_options=WORKER_CONNECTIONS,
        )
        self._async = AsyncQueue(
            self.dsn, schema=schema, pool_size=4, connection_options=WORKER_CONNECTIONS
        )
        # The worker's own: claims, renewals and acknowledgements never queue behind
        # a handler's open transaction for a connection.
        self._claims, renewals, acknowledgements = (self._own_queue() for _ in range(3))
        self._threads = DaemonThreads(self.concurrency, "leaseq-job")
        self._outcomes = Outcomes(acknowledgements)
        self._leases = LeaseKeeper(
            renewals,
            self._running,
            self._lose,
            renew_fraction=self.renew_fraction,
            stats=self.stats,
        )
        services = {
            "outcomes": self._outcomes.run(),
            "heartbeat": self._heartbeat(),
            "deadlines": self._leases.watch_deadlines(),
        }
        if self.listen:
            listener = AsyncQueue(
                self.listen_dsn, schema=schema, pool_size=1, connection_options=WORKER_CONNECTIONS
            )
            services["listen"] = listen_for_work(
                listener, set(self.queues), wake=self._wakeup.set, stats=self.stats
            )
        if self.maintenance:
            services["maintenance"] = Maintenance(
                self._async, interval=self.maintenance_interval
            ).run()
        background = [asyncio.create_task(c, name=f"leaseq-{n}") for n, c in services.items()]
        for task in background:
            task.add_done_callback(self._service_ended)
        log.info(
            "worker started: queues=%s concurrency=%d", ",".join(self.queues), self.concurrency
        )
        try:
            await self._claim_loop()
            await self._shutdown()
        except asyncio.CancelledError:
            if self._crashed is None:
                raise  # a second signal, or our caller cancelled us
        finally:
            for task in background:
                task.cancel()
            await asyncio.gather(*background, return_exceptions=True)
            # Bounded: with the database away, pending outcomes are left to lease expiry.
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._outcomes.drain(), 10)
            self._threads.shutdown()  # a thread still running ends with the process
            for queue in (self._claims, renewals, acknowledgements, self._async):
                await queue.close()
            self._sync.close()
            if install_signal_handlers:
                for signum in (signal.SIGTERM, signal.SIGINT):
                    loop.remove_signal_handler(signum)
            log.info("worker stopped: %s", self.stats)
        if self._crashed is not None:
            raise RuntimeError("a worker service crashed") from self._crashed

    def _own_queue(self) -> AsyncQueue:
        """One connection for one of the worker's services (they send one statement at a time)."""
        return AsyncQueue(
            self.dsn, schema=self.app.schema, pool_size=1, connection_options=WORKER_CONNECTIONS
        )

    def _service_ended(self, task: asyncio.Task[None]) -> None:
        """A background service must never end on its own: stop the worker if one does."""
        if task.cancelled():
            return
        log.error(
            "%s stopped unexpectedly; stopping the worker",
            task.get_name(),
            exc_info=task.exception(),
        )
        self._crashed = task.exception()
        if self._main is not None:
            self._main.cancel()

    async def _shutdown(self) -> None:
        """Wait for every attempt (sync threads too) up to the grace period, then release."""
        deadline = time.monotonic() + self.shutdown_grace
        while self._running and time.monotonic() < deadline:
            await self._sleep_until_woken(deadline - time.monotonic())
        if not self._running:
            return
        log.warning("releasing %d unfinished jobs", len(self._running))
        self._releasing = True
        left = list(self._running.values())
        # Async handlers first: cancelled, they stop (and clean up) before their release.
        # A sync handler's thread cannot be stopped: its job is released while the thread
        # runs on; it is a daemon and ends with the process, and job.lost fences it.
        for cancellable in (True, False):
            tasks = [r.task for r in left if r.task is not None and r.cancellable is cancellable]
            for running in left:
                if running.cancellable is cancellable and not running.acknowledging:
                    running.context.mark_lost("worker shutting down")
                    if running.task is not None:
                        running.task.cancel()  # acknowledged ones just wait for their flush
            await asyncio.gather(*tasks, return_exceptions=True)

    # -- claiming ------------------------------------------------------------------

    def _free_slots(self) -> int:
        # A handler that has returned frees its slot at once: its acknowledgement
        # is flushed while the next claim runs. Unacknowledged jobs are capped at
        # `concurrency` too, so a slow database cannot make the worker hoard. An
        # attempt whose sync thread still runs (timed out, or lost) keeps its slot.
        acknowledging = sum(1 for r in self._running.values() if r.acknowledging)
        working = len(self._running) - acknowledging
        return min(self.concurrency - working, self.concurrency - acknowledging)

    async def _claim_loop(self) -> None:
        start = 0
        while not self._stopping.is_set():
            free = self._free_slots()
            if free <= 0:
                await self._sleep_until_woken(None)
                continue
            claimed = 0
            order = self.queues[start:] + self.queues[:start]
            start = (start + 1) % len(self.queues)
            try:
                for name in order:
                    claims = await self._claim(name, free)
                    claimed += len(claims)
                    free -= len(claims)
                    if free <= 0 or self._stopping.is_set():
                        break
            except TransientError as exc:
                self.stats.database_errors += 1
                log.warning("claim failed (%s); retrying", exc)
            if claimed == 0:
                await self._sleep_until_woken(self.poll_interval * random.uniform(0.5, 1.5))

    async def _claim(self, name: str, limit: int) -> list[Claim]:
        task = self.app.tasks[name]
        started = time.perf_counter()
        sent = time.monotonic()  # the leases run from no earlier than this
        claims = await self._claims.claim(name, limit=limit, lease=task.lease or self.lease)
        self.stats.claim_statements += 1
        self.stats.claim_seconds += time.perf_counter() - started
        self.stats.claimed += len(claims)
        for claim in claims:
            stale = self._latest.get(claim.job_id)
            if stale is not None:
                self._lose(stale, "the lease expired and the job was claimed again")
            context = JobContext(claim, self._sync, self._async)
            running = _Running(claim, context, lease_from=sent, cancellable=task.is_async)
            self._running[(claim.job_id, claim.lease_version)] = running
            self._latest[claim.job_id] = running
            running.task = asyncio.create_task(self._execute(running, task))
        if claims:
            self._leases.attempt_started()
        return claims

    async def _sleep_until_woken(self, timeout: float | None) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wakeup.wait(), timeout)
        self._wakeup.clear()

    # -- running one job -------------------------------------------------------------

    async def _execute(self, running: _Running, task: Task) -> None:
        context, claim = running.context, running.claim
        try:
            outcome = await self._outcome_of(running, task)
            if running.lost:
                outcome = None  # never acknowledge the result of a lost lease
            if outcome is not None:
                running.acknowledging = True
                self._wakeup.set()  # the slot is free for the next claim
                answer = await self._outcomes.report(outcome)
                if answer is Answer.LOST:
                    self._lose(running, f"{outcome.kind.value} refused: lease no longer held")
                else:
                    self._count(answer)
            elif context.completed:
                self.stats.completed += 1
        except Exception:
            log.exception("job %d: could not record its outcome", claim.job_id)
        finally:
            self._running.pop((claim.job_id, claim.lease_version), None)
            if self._latest.get(claim.job_id) is running:
                del self._latest[claim.job_id]
            self._wakeup.set()

    async def _outcome_of(self, running: _Running, task: Task) -> Outcome | None:
        """Run the handler; say how to acknowledge it (None: nothing to acknowledge)."""
        context, claim = running.context, running.claim
        try:
            timed_out = functools.partial(self._timed_out, running)
            if task.is_async:
                await run_on_loop(task, context, timed_out)
            else:
                await run_in_thread(self._threads, task, context, timed_out)
            return None if context.completed else Outcome(Kind.COMPLETE, claim)
        except TimedOut:
            if context.completed:  # its transaction committed before the timeout
                return None
            return self._retry_or_fail(task, claim, None, f"timed out after {task.timeout:g}s")
        except Retry as request:
            return self._retry_or_fail(task, claim, request.delay, request.reason)
        except LeaseLost:
            return None
        except asyncio.CancelledError:
            if running.lost:
                return None
            if self._releasing:
                return Outcome(Kind.RELEASE, claim)
            raise
        except Exception as exc:  # a TimeoutError the handler raised itself included
            if context.completed:  # the job's transaction already completed it
                log.warning("job %d raised after completing: %r", claim.job_id, exc)
                return None
            if task.errors.classify(exc) is Verdict.FAIL:
                return Outcome(Kind.FAIL, claim, error=exc)
            return self._retry_or_fail(task, claim, None, exc)

    def _timed_out(self, running: _Running) -> None:
        self.stats.timeouts += 1
        running.context.mark_lost("timed out")  # job.transaction() now refuses

    def _retry_or_fail(
        self, task: Task, claim: Claim, delay: float | None, error: object
    ) -> Outcome:
        if not task.attempts_left(claim.attempts, claim.max_attempts):
            return Outcome(Kind.FAIL, claim, error=error)
        if delay is None:
            delay = task.retry_delay(claim.attempts)
        return Outcome(Kind.RETRY, claim, delay=delay, error=error)

    def _count(self, answer: Answer) -> None:
        """Count an acknowledgement as what the database did (a retry may have failed it)."""
        match answer:
            case Answer.COMPLETED:
                self.stats.completed += 1
            case Answer.RETRIED:
                self.stats.retried += 1
            case Answer.FAILED:
                self.stats.failed += 1
            case Answer.RELEASED:
                self.stats.released += 1
            case Answer.LOST:
                pass  # counted by _lose

    def _lose(self, running: _Running, reason: str) -> None:
        if running.lost:
            return
        running.lost = True
        running.context.mark_lost(reason)
        self.stats.lost_leases += 1
        log.warning(
            "job %d (lease version %d): lease lost: %s",
            running.claim.job_id,
            running.claim.lease_version,
            reason,
        )
        # A sync attempt stays until its thread returns (it holds a slot); job.lost tells it.
        if running.cancellable and running.task is not None and not running.acknowledging:
            running.task.cancel()

    # -- leases ----------------------------------------------------------------------

    async def _heartbeat(self) -> None:
        await self._leases.renew_forever()
