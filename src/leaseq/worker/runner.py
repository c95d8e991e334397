"""The worker: claims what it has room for, runs handlers, keeps their leases.

One asyncio loop per process. Async handlers run on it; sync handlers run in a
thread pool of ``concurrency`` threads, so CPU-bound work cannot stop the loop
from renewing leases. Background tasks:

* the claim loop: claims at most as many jobs as there are free slots, in one
  statement per queue; sleeps until a NOTIFY, a freed slot or a jittered poll;
* the heartbeat: renews due leases in one fenced batch statement; a lease it
  cannot renew is lost: the handler is told (cancelled or signalled) and its
  result is never acknowledged;
* outcomes: completions, retries and failures flushed in batches;
* the listener (optional): LISTEN for the schema's channel, re-established
  after every reconnect; polling runs behind it regardless;
* maintenance (optional): the reaper, on whichever worker holds the lock.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import signal
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

from .. import db
from ..client import AsyncQueue, Queue
from ..config import database_url
from ..errors import InvalidArgument, LeaseLost
from ..maintenance import Maintenance
from ..retry import Retry, Verdict
from ..types import Claim
from .app import App, Task
from .context import JobContext
from .listener import listen_for_work
from .outcomes import Kind, Outcomes
from .state import Running as _Running
from .state import WorkerStats

log = logging.getLogger("leaseq.worker")


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
        self.listen_dsn = listen_dsn or self.dsn
        self.listen_dsn = database_url(self.listen_dsn)  # the funnel: redact its password
        self.renew_fraction = renew_fraction
        self.shutdown_grace = shutdown_grace
        self.maintenance = maintenance
        self.maintenance_interval = maintenance_interval
        self.stats = WorkerStats()
        # Keyed by claim, not job: this worker may reclaim a job whose lease it lost.
        self._running: dict[tuple[int, int], _Running] = {}
        self._latest: dict[int, _Running] = {}  # the newest attempt of each job here
        self._zombies = 0  # sync handlers still running after their attempt ended
        self._stopping = asyncio.Event()
        self._wakeup = asyncio.Event()
        self._job_started = asyncio.Event()
        self._releasing = False
        self._signals = 0
        self._main: asyncio.Task[None] | None = None
        self._crashed: BaseException | None = None

    # -- lifecycle ---------------------------------------------------------------

    def request_stop(self) -> None:
        """Stop claiming; running jobs get the grace period, then are released."""
        self._stopping.set()
        self._wakeup.set()

    def _on_signal(self) -> None:
        self._signals += 1
        if self._signals == 1:
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
        self._sync = Queue(self.dsn, schema=schema, pool_size=self.concurrency,
                           connection_options=db.WORKER_OPTIONS)  # fmt: skip
        self._async = AsyncQueue(self.dsn, schema=schema, pool_size=4,
                                 connection_options=db.WORKER_OPTIONS)  # fmt: skip
        self._executor = ThreadPoolExecutor(self.concurrency, thread_name_prefix="leaseq-job")
        self._outcomes = Outcomes(self._async)
        services = {"outcomes": self._outcomes.run(), "heartbeat": self._heartbeat()}
        if self.listen:
            services["listen"] = listen_for_work(
                self.listen_dsn, self._async.store.listen(), set(self.queues),
                wake=self._wakeup.set, stats=self.stats,
            )  # fmt: skip
        if self.maintenance:
            services["maintenance"] = Maintenance(
                self._async, interval=self.maintenance_interval
            ).run()
        background = [asyncio.create_task(c, name=f"leaseq-{n}") for n, c in services.items()]
        for task in background:
            task.add_done_callback(self._service_ended)
        log.info("worker started: queues=%s concurrency=%d", ",".join(self.queues),
                 self.concurrency)  # fmt: skip
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
            self._executor.shutdown(wait=False, cancel_futures=True)
            await self._async.close()
            self._sync.close()
            if install_signal_handlers:
                for signum in (signal.SIGTERM, signal.SIGINT):
                    loop.remove_signal_handler(signum)
            log.info("worker stopped: %s", self.stats)
        if self._crashed is not None:
            raise RuntimeError("a worker service crashed") from self._crashed

    def _service_ended(self, task: asyncio.Task[None]) -> None:
        """A background service must never end on its own: stop the worker if one does."""
        if task.cancelled():
            return
        log.error("%s stopped unexpectedly; stopping the worker", task.get_name(),
                  exc_info=task.exception())  # fmt: skip
        self._crashed = task.exception()
        if self._main is not None:
            self._main.cancel()

    async def _shutdown(self) -> None:
        deadline = time.monotonic() + self.shutdown_grace
        while self._running and time.monotonic() < deadline:
            await self._sleep_until_woken(deadline - time.monotonic())
        if not self._running:
            return
        log.warning("releasing %d unfinished jobs", len(self._running))
        self._releasing = True
        tasks = []
        for running in list(self._running.values()):
            if running.task is None:
                continue
            tasks.append(running.task)
            if not running.acknowledging:  # finished ones just wait for their flush
                running.context.mark_lost("worker shutting down")
                running.task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    # -- claiming ------------------------------------------------------------------

    def _free_slots(self) -> int:
        # A handler that has returned frees its slot at once: its acknowledgement
        # is flushed while the next claim runs. Unacknowledged jobs are capped at
        # `concurrency` too, so a slow database cannot make the worker hoard.
        acknowledging = sum(1 for r in self._running.values() if r.acknowledging)
        working = len(self._running) - acknowledging
        return min(self.concurrency - working - self._zombies,
                   self.concurrency - acknowledging)  # fmt: skip

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
            except Exception as exc:
                if not db.is_connection_error(exc):
                    raise
                self.stats.database_errors += 1
                log.warning("claim failed (%s); retrying", exc)
            if claimed == 0:
                await self._sleep_until_woken(self.poll_interval * random.uniform(0.5, 1.5))

    async def _claim(self, name: str, limit: int) -> list[Claim]:
        task = self.app.tasks[name]
        started = time.perf_counter()
        claims = await self._async.claim(name, limit=limit, lease=task.lease or self.lease)
        self.stats.claim_statements += 1
        self.stats.claim_seconds += time.perf_counter() - started
        self.stats.claimed += len(claims)
        for claim in claims:
            stale = self._latest.get(claim.job_id)
            if stale is not None:
                self._lose(stale, "the lease expired and the job was claimed again")
            running = _Running(claim, JobContext(claim, self._sync, self._async))
            self._running[(claim.job_id, claim.lease_version)] = running
            self._latest[claim.job_id] = running
            running.task = asyncio.create_task(self._execute(running, task))
        if claims:
            self._job_started.set()
        return claims

    async def _sleep_until_woken(self, timeout: float | None) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wakeup.wait(), timeout)
        self._wakeup.clear()

    # -- running one job -------------------------------------------------------------

    async def _execute(self, running: _Running, task: Task) -> None:
        context, claim = running.context, running.claim
        try:
            kind, delay, error = await self._outcome_of(running, task)
            if running.lost:
                kind = None  # never acknowledge the result of a lost lease
            if kind is not None:
                running.acknowledging = True
                self._wakeup.set()  # the slot is free for the next claim
                if await self._outcomes.report(kind, claim, delay=delay, error=error):
                    self._count(kind)
                else:
                    self._lose(running, f"{kind.value} refused: lease no longer held")
            elif context.completed:
                self.stats.completed += 1
        except Exception:
            log.exception("job %d: could not record its outcome", claim.job_id)
        finally:
            self._running.pop((claim.job_id, claim.lease_version), None)
            if self._latest.get(claim.job_id) is running:
                del self._latest[claim.job_id]
            self._wakeup.set()

    async def _outcome_of(
        self, running: _Running, task: Task
    ) -> tuple[Kind | None, float | None, object]:
        """Run the handler; say how to acknowledge it (None: nothing to acknowledge)."""
        context, claim = running.context, running.claim
        try:
            if task.is_async and task.timeout is None:
                await task.handler(context)
            elif task.is_async:
                await asyncio.wait_for(task.handler(context), task.timeout)
            else:
                await self._run_in_thread(running, task)
            return (None if context.completed else Kind.COMPLETE), None, None
        except Retry as request:
            return self._retry_or_fail(task, claim, request.delay, request.reason)
        except TimeoutError:
            self.stats.timeouts += 1
            context.mark_lost("timed out")
            return self._retry_or_fail(task, claim, None, f"timed out after {task.timeout:g}s")
        except LeaseLost:
            return None, None, None
        except asyncio.CancelledError:
            if running.lost:
                return None, None, None
            if self._releasing:
                return Kind.RELEASE, None, None
            raise
        except Exception as exc:
            if context.completed:  # the job's transaction already completed it
                log.warning("job %d raised after completing: %r", claim.job_id, exc)
                return None, None, None
            if task.errors.classify(exc) is Verdict.FAIL:
                return Kind.FAIL, None, exc
            return self._retry_or_fail(task, claim, None, exc)

    async def _run_in_thread(self, running: _Running, task: Task) -> None:
        future = asyncio.get_running_loop().run_in_executor(
            self._executor, task.handler, running.context
        )
        try:
            await asyncio.wait_for(asyncio.shield(future), task.timeout)
        except (TimeoutError, asyncio.CancelledError):
            # The thread cannot be stopped: it keeps its slot until it returns.
            self._zombies += 1
            future.add_done_callback(self._zombie_done)
            raise

    def _zombie_done(self, _: object) -> None:
        self._zombies -= 1
        self._wakeup.set()

    def _retry_or_fail(
        self, task: Task, claim: Claim, delay: float | None, error: object
    ) -> tuple[Kind | None, float | None, object]:
        if not task.attempts_left(claim.attempts, claim.max_attempts):
            return Kind.FAIL, None, error
        return Kind.RETRY, delay if delay is not None else task.retry_delay(claim.attempts), error

    def _count(self, kind: Kind) -> None:
        if kind is Kind.COMPLETE:
            self.stats.completed += 1
        elif kind is Kind.RETRY:
            self.stats.retried += 1
        elif kind is Kind.FAIL:
            self.stats.failed += 1
        else:
            self.stats.released += 1

    def _lose(self, running: _Running, reason: str) -> None:
        if running.lost:
            return
        running.lost = True
        running.context.mark_lost(reason)
        self.stats.lost_leases += 1
        log.warning("job %d (lease version %d): lease lost: %s", running.claim.job_id,
                    running.claim.lease_version, reason)  # fmt: skip
        if running.task is not None and not running.acknowledging:
            running.task.cancel()

    # -- leases ----------------------------------------------------------------------

    async def _heartbeat(self) -> None:
        while True:
            now = time.monotonic()
            due = [
                r for r in self._running.values()
                if not r.lost and now - r.renewed_at >= r.claim.lease_seconds * self.renew_fraction
            ]  # fmt: skip
            if due:
                try:
                    results = await self._async.renew_many([r.claim for r in due])
                except Exception as exc:
                    if not db.is_connection_error(exc):
                        raise
                    self.stats.database_errors += 1
                    log.warning("lease renewal failed (%s); retrying", exc)
                    results = []
                for running, (_, until) in zip(due, results, strict=False):
                    if until is not None:
                        running.renewed_at = now
                    elif not running.acknowledging:
                        # (an acknowledged job is no longer running: its own outcome tells)
                        self._lose(running, "the lease could not be renewed")
            # A new job may need its first renewal sooner than the current tick.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._job_started.wait(), self._heartbeat_tick())
            self._job_started.clear()

    def _heartbeat_tick(self) -> float:
        shortest = min((r.claim.lease_seconds for r in self._running.values()), default=60.0)
        return min(max(shortest * self.renew_fraction / 4, 0.05), 1.0)
