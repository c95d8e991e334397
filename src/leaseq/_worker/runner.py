"""The worker: its lifecycle; the claim loop (:mod:`.claiming`) and the services
it starts do the work.

One asyncio loop per process. The claim loop claims at most as many jobs as
there are free slots (:mod:`.registry`), in one statement per queue, round
robin, from the queues that may have work (:mod:`.hints`), and sleeps until a
NOTIFY, a freed slot or a jittered poll. Each claim
becomes an attempt (:mod:`.attempt`): async handlers run on the loop, sync ones
in daemon threads (:mod:`.threads`), so CPU-bound work cannot stop the loop from
renewing leases and a handler that never returns cannot keep a stopped process
alive. Background services, each on connections of its own (:mod:`.connections`)
so that no handler's transaction can make it wait, and each supervised (one
that ends stops the worker loudly):

* ``heartbeat`` and ``deadlines`` (:mod:`.leases`): batched renewals, and a
  local deadline per attempt; an attempt whose lease is gone is lost;
* ``outcomes`` (:mod:`.outcomes`): acknowledgements flushed in batches;
* ``listen`` (optional, :mod:`.listener`): NOTIFY as a wake-up hint;
* ``maintenance`` (optional): the reaper, on whichever worker holds the lock.

Shutdown stops claiming, waits for every attempt (sync threads too) up to the
grace period, then releases what is left.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Coroutine, Iterable
from typing import Any, TypeGuard

from .. import _metrics
from .._config import database_url
from .._errors import (
    InvalidDatabaseURL,
    LeaseqError,
    NotMigrated,
    TransientError,
)
from .._logs import get_logger
from .._maintenance import Maintenance
from .._metrics import Metrics
from .app import App
from .attempt import AttemptRunner
from .claiming import ClaimLoop
from .connections import WorkerClients
from .hints import WorkHints
from .leases import LeaseKeeper
from .listener import listen_for_work
from .outage import Outage
from .outcomes import ACKNOWLEDGEMENT_WAIT, Outcomes
from .processes import ProcessPool
from .registry import AttemptRegistry
from .scheduler import Scheduler
from .settings_check import DEFAULT_RENEW_FRACTION, check_settings
from .signals import StopSignals, add_stop_handler, remove_stop_handler
from .state import WorkerStats
from .wake_entries import WakeEntries

log = get_logger("leaseq.worker")

#: What no retry can mend: the worker stops, and says what to fix in one line
#: (``leaseq worker`` exits with it; its --processes supervisor restarts no child).
SETUP_ERRORS = (NotMigrated, InvalidDatabaseURL)


#: After a stop's releases (ACKNOWLEDGEMENT_WAIT at most), how long it waits at
#: most for its services to end, its last outcomes to flush and its pools to close.
CLOSE_WAIT = 5.0


def _left(deadline: float) -> float:
    return max(deadline - time.monotonic(), 0.0)


def _refused_for_good(error: BaseException | None) -> TypeGuard[LeaseqError]:
    """A leaseq error that no retry mends (the database refused: a privilege,
    a constraint), as against one that passes (the database away) or a bug."""
    return isinstance(error, LeaseqError) and not isinstance(error, TransientError)


class Worker:
    """Runs an :class:`App`'s handlers until told to stop.

    ``queues``: the names of the queues it serves (a list, or any iterable of
    names, read once), each with a handler in the app; None (the default) serves
    every queue of the app. An empty one is refused.

    ``stats`` (WorkerStats) counts what it did; ``metrics`` (``leaseq.metrics`` unless
    given, None for none) is the Prometheus view of the same: claims, recovered
    leases, waits, handler times, outcomes as the database answered, running jobs.

    ``durable_acknowledgements=False`` commits the acknowledgements (completions,
    retries, failures, releases) without waiting for the WAL flush: more jobs per
    second, and a database server crash may lose the last fraction of a second of
    them, whose jobs then run again once their leases expire, as after a worker
    crash. Claims and ``job.transaction()`` commits stay durable.
    """

    def __init__(
        self,
        app: App,
        *,
        dsn: str | None = None,
        queues: Iterable[str] | None = None,
        concurrency: int = 10,
        lease: float | None = None,
        poll_interval: float = 1.0,
        listen: bool = True,
        listen_dsn: str | None = None,
        renew_fraction: float = DEFAULT_RENEW_FRACTION,
        shutdown_grace: float = 30.0,
        maintenance: bool = True,
        maintenance_interval: float = 5.0,
        metrics: Metrics | None = _metrics.DEFAULT,
        durable_acknowledgements: bool = True,
    ) -> None:
        served = check_settings(
            app,
            queues=queues,
            concurrency=concurrency,
            lease=lease,
            poll_interval=poll_interval,
            listen=listen,
            listen_dsn=listen_dsn,
            renew_fraction=renew_fraction,
            shutdown_grace=shutdown_grace,
            maintenance=maintenance,
            maintenance_interval=maintenance_interval,
            metrics=metrics,
            durable_acknowledgements=durable_acknowledgements,
            dsn=dsn,
        )
        self.app = app
        self.dsn = database_url(dsn or app.dsn)
        self.queues = served  # (read once by the check: a generator is used up)
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
        self.durable_acknowledgements = durable_acknowledgements
        self.stats = WorkerStats()
        #: Where this worker counts (the Prometheus view of its stats); None: nowhere.
        self.metrics = metrics
        self._attempts = AttemptRegistry(concurrency, self.stats, self.metrics)
        self._hints = WorkHints(self.queues, poll_interval)
        #: Said once in the log when the database goes away, once when it is back.
        self._outage = Outage()
        self._stopping = asyncio.Event()
        #: When the stop was first requested (monotonic): the grace runs from then,
        #: for the claim in flight and the running jobs alike.
        self._stop_requested_at: float | None = None
        #: A second signal: exit without waiting for anything.
        self._exiting_now = False
        self._signals = StopSignals()
        self._main: asyncio.Task[None] | None = None
        #: Whether run() is past its main loop, cleaning up.
        self._finishing = False
        self._claims: ClaimLoop | None = None  # made by run()
        self._crashed: BaseException | None = None
        self._burst = False

    # -- lifecycle ---------------------------------------------------------------

    def request_stop(self) -> None:
        """Stop claiming; running jobs get the grace period, then are released."""
        if not self._stopping.is_set():
            self._stop_requested_at = time.monotonic()
            if self._claims is not None:
                self._claims.abandon_after(self.shutdown_grace)  # the claim in flight, if any
        self._stopping.set()
        self._attempts.wake()

    def _on_signal(self) -> None:
        count = self._signals.received()
        if count == 0:
            log.info("the stop signal again (sent to the group and forwarded): one signal")
        elif count == 1:
            log.info("stopping: finishing running jobs (up to %.0fs)", self.shutdown_grace)
            self.request_stop()
        elif self._main is not None:
            log.warning("second signal: exiting now; unfinished leases will expire")
            self._exiting_now = True
            self._main.cancel()

    async def run(self, *, install_signal_handlers: bool = False, burst: bool = False) -> None:
        """Run until :meth:`request_stop` (or a signal, with ``install_signal_handlers``:
        SIGTERM and SIGINT of the running loop, shared by the Workers that ask for
        them; they replace the application's own handlers of those signals while a
        Worker runs, which are put back when the last one ends).

        ``burst``: stop by itself once no job is claimable now and none runs (every
        outcome acknowledged), like RQ's burst mode; jobs that wait (a retry's
        backoff, a delay, a full rate window's next room excepted) stay queued, and
        no periodic job is enqueued. What ``leaseq.testing.drain`` runs.
        """
        if self._main is not None:
            # Its events and registry belong to the first run's loop, and its stop
            # stays requested: a second run claimed a job, then crashed with it.
            raise RuntimeError("a Worker runs once: make a new Worker to run again")
        self._burst = burst
        loop = asyncio.get_running_loop()
        self._main = asyncio.current_task()
        if install_signal_handlers:
            add_stop_handler(loop, self._on_signal)
        self._clients = WorkerClients.open(
            self.dsn,
            self.app.schema,
            concurrency=self.concurrency,
            listen_dsn=self.listen_dsn if self.listen else None,
            durable_acknowledgements=self.durable_acknowledgements,
        )
        outcomes = Outcomes(self._clients.acknowledgements, outage=self._outage)
        self._runner = AttemptRunner(
            self._attempts,
            outcomes,
            self.stats,
            self.metrics,
            slots=self.concurrency,
            made_work=self._work_hint,
            hooks=self.app.hooks,
            processes=self._process_pool(),
        )
        self._wake = WakeEntries(
            self._clients.claims,
            self.queues,
            poll_interval=self.poll_interval,
            enabled=self._clients.listener is not None and not burst,
        )
        self._leases = LeaseKeeper(
            self._clients.renewals,
            self._attempts,
            renew_fraction=self.renew_fraction,
            stats=self.stats,
            outage=self._outage,
        )
        background = [
            asyncio.create_task(service, name=f"leaseq-{name}")
            for name, service in self._services(outcomes).items()
        ]
        for task in background:
            task.add_done_callback(self._service_ended)
        stop_watchdog = self._leases.watch_deadlines_from_a_thread()
        untrack = None
        if self.metrics is not None:
            untrack = self.metrics.track_running(self._attempts.running)
        log.info(
            "worker started: queues=%s concurrency=%d", ",".join(self.queues), self.concurrency
        )
        self._claims = ClaimLoop(
            client=self._clients.claims,
            handlers=self._clients.handlers,
            handlers_async=self._clients.handlers_async,
            tasks=self.app.tasks,
            queues=self.queues,
            lease=self.lease,
            poll_interval=self.poll_interval,
            burst=burst,
            stopping=self._stopping,
            attempts=self._attempts,
            hints=self._hints,
            wake=self._wake,
            runner=self._runner,
            leases=self._leases,
            stats=self.stats,
            metrics=self.metrics,
            outage=self._outage,
        )
        try:
            await self._claim_until_stopped(self._claims)
        except asyncio.CancelledError:
            if self._crashed is None:
                raise  # a second signal, or our caller cancelled us
        finally:
            # A service that ends from here on must not cancel this task: its
            # cleanup would be cut short, and the caller would get a
            # CancelledError for the error the claim loop raised (both saw
            # the same schema behind the code).
            self._finishing = True
            # Cancelled with jobs running (by our caller, a crashed service, a
            # second signal): nothing renews their leases from here on.
            await self._attempts.stop_unrenewed(ACKNOWLEDGEMENT_WAIT, now=self._exiting_now)
            # From here on, CLOSE_WAIT at most in all: with the database away, a
            # cancelled query waits for its cancel (5 s, then 5 more) and each pool
            # for its connection attempt (5 s): a stop took 37 s, past the usual
            # 30 s between a container's SIGTERM and its SIGKILL.
            closing_by = time.monotonic() + CLOSE_WAIT
            stop_watchdog()  # (the jobs are finished or given back: nothing left to tell)
            for task in background:
                task.cancel()
            if background:
                await asyncio.wait(background, timeout=CLOSE_WAIT)
            # Pending outcomes the database does not take by then are left to
            # their leases' expiry.
            with contextlib.suppress(Exception):
                await asyncio.wait_for(outcomes.drain(), _left(closing_by))
            # Entries left behind cost notifications until they expire, nothing more.
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._wake.leave_all(), _left(closing_by))
            # In a thread: stopping the handlers' child processes joins them (2 s
            # for one still busy, then killed), which must not hold the event loop.
            await asyncio.to_thread(self._runner.close)
            if untrack is not None:
                untrack()
            await self._clients.close(_left(closing_by))
            if install_signal_handlers:
                remove_stop_handler(loop, self._on_signal)
            log.info("worker stopped: %s", self.stats)
        if isinstance(self._crashed, SETUP_ERRORS) or _refused_for_good(self._crashed):
            raise self._crashed  # not a crash: what to fix is in its one line (the CLI's)
        if self._crashed is not None:
            raise RuntimeError("a worker service crashed") from self._crashed

    async def _claim_until_stopped(self, claims: ClaimLoop) -> None:
        try:
            await claims.run()
        except LeaseqError as exc:
            if not _refused_for_good(exc):
                raise
            # The database refused a claim for good (a revoked grant): a stop as
            # on a signal, so that the running jobs finish or are given back.
            if not isinstance(exc, SETUP_ERRORS):  # (those are the caller's one line)
                log.error("claims: %s; stopping the worker", exc)
            self.request_stop()
            await self._shutdown()
            raise
        await self._shutdown()

    def _process_pool(self) -> ProcessPool | None:
        """Child processes for the handlers with executor="process": up to one per
        slot (a claim is only for work that can start now), started when needed."""
        if not any(self.app.tasks[name].executor == "process" for name in self.queues):
            return None
        return ProcessPool(self.concurrency, self.dsn, self.app.schema)

    def _services(self, outcomes: Outcomes) -> dict[str, Coroutine[Any, Any, None]]:
        """The background services, by name; none of them ever returns on its own."""
        services = {
            "outcomes": outcomes.run(),
            "heartbeat": self._leases.renew_forever(),
            "deadlines": self._leases.watch_deadlines(),
        }
        if self._clients.listener is not None:
            services["listen"] = listen_for_work(
                self._clients.listener,
                set(self.queues),
                work=self._work_hint,
                lost=self._leases.check_now,
                stats=self.stats,
                # Another database (--listen-database-url): its outages are its own;
                # shared, each of its retries ended the other services' outage.
                outage=self._outage if self.listen_dsn == self.dsn else Outage(),
            )
        if self._wake.enabled:
            services["wake-entries"] = self._wake.keep_fresh(self._work_hint)
        if self.app.schedules and not self._burst:
            scheduler = Scheduler(self._clients.handlers_async, self.app.schedules, self.metrics)
            services["schedules"] = scheduler.run()
        if self.maintenance:
            reaper = Maintenance(
                self._clients.handlers_async,
                interval=self.maintenance_interval,
                metrics=self.metrics,
            )
            services["maintenance"] = reaper.run()
        return services

    def _service_ended(self, task: asyncio.Task[None]) -> None:
        """A background service must never end on its own: stop the worker if one does."""
        if task.cancelled():
            return
        error = task.exception()
        self._crashed = error
        if _refused_for_good(error) and not isinstance(error, SETUP_ERRORS):
            # The database said no, and no retry mends it (a revoked grant): one
            # line, and a stop as on a signal, so that the claim in flight and
            # the running jobs end as they do then (finished, or given back).
            log.error("%s: %s; stopping the worker", task.get_name(), error)
            self.request_stop()
            return
        if isinstance(error, SETUP_ERRORS):  # what to do is in its one line (run raises it)
            log.error("%s: %s; stopping the worker", task.get_name(), error)
        else:
            log.error(
                "%s stopped unexpectedly; stopping the worker", task.get_name(), exc_info=error
            )
        if self._main is not None and not self._finishing:
            self._main.cancel()

    async def _shutdown(self) -> None:
        """Wait for every attempt (sync threads too) up to the grace period, then release.

        The grace runs from the stop request: a claim in flight at the stop waited
        out its own grace meanwhile, and the running jobs' is the same one (it
        was waited for twice: the jobs were told to stop after twice the grace)."""
        started = self._stop_requested_at
        deadline = (time.monotonic() if started is None else started) + self.shutdown_grace
        while self._attempts and time.monotonic() < deadline:
            await self._attempts.sleep_until_woken(deadline - time.monotonic())
        if self._attempts:
            log.warning("releasing %d unfinished jobs", len(self._attempts))
            await self._attempts.release_all(ACKNOWLEDGEMENT_WAIT)

    def _work_hint(self, queue: str | None) -> None:
        """Something may have made ``queue`` (None: any queue, the listener
        reconnected) claimable: claim again."""
        if queue is None:
            self._wake.forget()  # the entries are made again, from the next claims
        self._hints.may_have_work(queue)
        self._attempts.wake()
