"""The worker: its lifecycle and its claim loop; the rest are services it starts.

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
import random
import signal
import time
from collections.abc import Coroutine, Sequence
from typing import Any

from .. import _metrics, _tracing
from .. import _validate as validate
from .._config import database_url
from .._errors import InvalidArgument, InvalidDatabaseURL, NotMigrated, TransientError
from .._logs import get_logger
from .._maintenance import Maintenance
from .._metrics import Metrics
from .._types import Claim, Claims
from .._waiting import cancelling
from .app import App
from .attempt import AttemptRunner
from .connections import WorkerClients
from .context import JobContext
from .hints import WorkHints
from .leases import LeaseKeeper
from .listener import listen_for_work
from .outcomes import Outcomes
from .processes import ProcessPool
from .registry import AttemptRegistry
from .scheduler import Scheduler
from .signals import StopSignals
from .state import WorkerStats

log = get_logger("leaseq.worker")

#: How long a stopping worker waits for its last acknowledgements (the releases,
#: then whatever is still unflushed) when the database does not take them; then
#: it leaves them to their leases' expiry, as a crash would.
ACKNOWLEDGEMENT_WAIT = 10.0
#: A day: a poll interval, shutdown grace or maintenance interval past it is a
#: unit mistake (milliseconds given as seconds).
MAX_INTERVAL_SECONDS = 86400.0
#: The most jobs one worker runs at once.
MAX_CONCURRENCY = 10_000
#: What no retry can mend: the worker stops, and says what to fix in one line
#: (``leaseq worker`` exits with it; its --processes supervisor restarts no child).
SETUP_ERRORS = (NotMigrated, InvalidDatabaseURL)


class Worker:
    """Runs an :class:`App`'s handlers until told to stop.

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
        metrics: Metrics | None = _metrics.DEFAULT,
        durable_acknowledgements: bool = True,
    ) -> None:
        if not isinstance(app, App):
            raise InvalidArgument(f"a Worker runs a leaseq.App, got {app!r}")
        if not app.tasks:
            raise InvalidArgument("the app has no tasks")
        if queues is not None and (
            isinstance(queues, str) or not all(isinstance(q, str) for q in queues)
        ):  # (a string would be read as its letters)
            raise InvalidArgument(f"queues must be a list of queue names, got {queues!r}")
        for flag, name in (
            (listen, "listen"),
            (maintenance, "maintenance"),
            (durable_acknowledgements, "durable_acknowledgements"),
        ):
            validate.flag(flag, name)
        unknown = set(queues or ()) - set(app.tasks)
        if unknown:
            raise InvalidArgument(f"no handler for queues: {', '.join(sorted(unknown))}")
        # Typed first: 1.5 failed only in run(), and "2" with a TypeError.
        if validate.positive_int(concurrency, "concurrency") > MAX_CONCURRENCY:
            raise InvalidArgument(f"concurrency must be between 1 and {MAX_CONCURRENCY}")
        if (
            isinstance(renew_fraction, bool)
            or not isinstance(renew_fraction, int | float)
            or not 0 < renew_fraction < 1  # (NaN is not)
        ):
            raise InvalidArgument(
                f"renew_fraction must be a number between 0 and 1, got {renew_fraction!r}"
            )
        # Checked before the DSN is looked up: with none given, that starts a server.
        validate.dsn(dsn, "dsn")
        validate.dsn(listen_dsn, "listen_dsn")
        # 0 or less would claim in a busy loop (and a burst never end); NaN, for ever.
        validate.seconds(poll_interval, "poll_interval", MAX_INTERVAL_SECONDS, allow_zero=False)
        validate.seconds(shutdown_grace, "shutdown_grace", MAX_INTERVAL_SECONDS)
        validate.seconds(
            maintenance_interval, "maintenance_interval", MAX_INTERVAL_SECONDS, allow_zero=False
        )
        validate.lease(lease)
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
        self.durable_acknowledgements = durable_acknowledgements
        self.stats = WorkerStats()
        #: Where this worker counts (the Prometheus view of its stats); None: nowhere.
        self.metrics = metrics
        self._attempts = AttemptRegistry(concurrency, self.stats, metrics)
        self._hints = WorkHints(self.queues, poll_interval)
        self._stopping = asyncio.Event()
        self._signals = StopSignals()
        self._main: asyncio.Task[None] | None = None
        #: The claim statement in flight, if any (cancelled past the grace of a stop).
        self._claiming: asyncio.Future[Claims] | None = None
        #: Whether the schema has every migration of this code (checked before a claim).
        self._schema_checked = False
        self._crashed: BaseException | None = None
        self._burst = False

    # -- lifecycle ---------------------------------------------------------------

    def request_stop(self) -> None:
        """Stop claiming; running jobs get the grace period, then are released."""
        if not self._stopping.is_set() and self._claiming is not None:
            # A claim in flight may wait on the database for long (a lock held by
            # a migration, a server away): it gets the grace, as running jobs do.
            claiming = self._claiming
            loop = claiming.get_loop()  # (thread-safe: a stop may come from another thread)
            loop.call_soon_threadsafe(
                loop.call_later, self.shutdown_grace, self._abandon_claim, claiming
            )
        self._stopping.set()
        self._attempts.wake()

    def _abandon_claim(self, claiming: asyncio.Future[Claims]) -> None:
        if not claiming.done():
            log.warning(
                "the claim in flight at the stop has not returned within the grace "
                "(%gs); cancelled",
                self.shutdown_grace,
            )
            claiming.cancel()  # psycopg cancels the statement: it rolls back, claiming nothing

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

    async def run(self, *, install_signal_handlers: bool = False, burst: bool = False) -> None:
        """Run until :meth:`request_stop` (or a signal, with ``install_signal_handlers``).

        ``burst``: stop by itself once no job is claimable now and none runs (every
        outcome acknowledged), like RQ's burst mode; jobs that wait (a retry's
        backoff, a delay, a full rate window's next room excepted) stay queued, and
        no periodic job is enqueued. What ``leaseq.testing.drain`` runs.
        """
        self._burst = burst
        loop = asyncio.get_running_loop()
        self._main = asyncio.current_task()
        if install_signal_handlers:
            for signum in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(signum, self._on_signal)
        self._clients = WorkerClients.open(
            self.dsn,
            self.app.schema,
            concurrency=self.concurrency,
            listen_dsn=self.listen_dsn if self.listen else None,
            durable_acknowledgements=self.durable_acknowledgements,
        )
        outcomes = Outcomes(self._clients.acknowledgements)
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
        self._leases = LeaseKeeper(
            self._clients.renewals,
            self._attempts,
            renew_fraction=self.renew_fraction,
            stats=self.stats,
        )
        background = [
            asyncio.create_task(service, name=f"leaseq-{name}")
            for name, service in self._services(outcomes).items()
        ]
        for task in background:
            task.add_done_callback(self._service_ended)
        untrack = None
        if self.metrics is not None:
            untrack = self.metrics.track_running(self._attempts.running)
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
                await asyncio.wait_for(outcomes.drain(), ACKNOWLEDGEMENT_WAIT)
            self._runner.close()
            if untrack is not None:
                untrack()
            await self._clients.close()
            if install_signal_handlers:
                for signum in (signal.SIGTERM, signal.SIGINT):
                    loop.remove_signal_handler(signum)
            log.info("worker stopped: %s", self.stats)
        if isinstance(self._crashed, SETUP_ERRORS):
            raise self._crashed  # not a crash: what to fix is in its one line (the CLI's)
        if self._crashed is not None:
            raise RuntimeError("a worker service crashed") from self._crashed

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
            )
        if self.app.schedules and not self._burst:
            scheduler = Scheduler(self._clients.handlers_async, self.app.schedules)
            services["schedules"] = scheduler.run()
        if self.maintenance:
            reaper = Maintenance(self._clients.handlers_async, interval=self.maintenance_interval)
            services["maintenance"] = reaper.run()
        return services

    def _service_ended(self, task: asyncio.Task[None]) -> None:
        """A background service must never end on its own: stop the worker if one does."""
        if task.cancelled():
            return
        error = task.exception()
        if isinstance(error, SETUP_ERRORS):  # what to do is in its one line (run raises it)
            log.error("%s: %s; stopping the worker", task.get_name(), error)
        else:
            log.error(
                "%s stopped unexpectedly; stopping the worker", task.get_name(), exc_info=error
            )
        self._crashed = error
        if self._main is not None:
            self._main.cancel()

    async def _shutdown(self) -> None:
        """Wait for every attempt (sync threads too) up to the grace period, then release."""
        deadline = time.monotonic() + self.shutdown_grace
        while self._attempts and time.monotonic() < deadline:
            await self._attempts.sleep_until_woken(deadline - time.monotonic())
        if self._attempts:
            log.warning("releasing %d unfinished jobs", len(self._attempts))
            await self._attempts.release_all(ACKNOWLEDGEMENT_WAIT)

    # -- claiming ------------------------------------------------------------------

    async def _claim_loop(self) -> None:
        start = 0
        swept = False  # burst: every queue was asked since the last job was claimed
        while not self._stopping.is_set():
            free = self._attempts.free_slots()
            if free <= 0:
                await self._attempts.sleep_until_woken(None)
                continue
            order = self.queues[start:] + self.queues[:start]
            start = (start + 1) % len(self.queues)
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
                    await self._clients.claims._require_migrated()
                    self._schema_checked = True
                for name, generation in asking:
                    claims = await self._claim(name, free)
                    if claims:
                        swept = False
                    if len(claims) < free:
                        self._hints.came_back_short(name, generation)
                    if claims.retry_in is not None:
                        self._hints.ask_again_in(name, claims.retry_in)
                    free -= len(claims)
                    if free <= 0 or self._stopping.is_set():
                        break
            except InvalidDatabaseURL:
                raise  # a setup error: no retry can connect with it
            except TransientError as exc:
                self.stats.database_errors += 1
                log.warning("claim failed (%s); retrying", exc)
                await self._attempts.sleep_until_woken(
                    self.poll_interval * random.uniform(0.5, 1.5)
                )

    async def _release_unstarted(self, claims: Claims) -> None:
        try:  # bounded as the stop's other releases: the database may be away
            results = await asyncio.wait_for(
                self._clients.claims.release_many(claims), ACKNOWLEDGEMENT_WAIT
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
        self.stats.released += len(released)
        if self.metrics is not None:
            for claim in released:
                self.metrics.queue(claim.queue).finished["released"].inc()
        log.info("gave back %d jobs whose claim returned after the stop", len(released))

    def _work_hint(self, queue: str | None) -> None:
        """Something may have made ``queue`` (None: any queue) claimable: claim again."""
        self._hints.may_have_work(queue)
        self._attempts.wake()

    async def _claim(self, name: str, limit: int) -> Claims:
        """Claim up to ``limit`` jobs of one queue and start an attempt for each."""
        task = self.app.tasks[name]
        started = time.perf_counter()
        sent = time.monotonic()  # the leases run from no earlier than this
        claiming = asyncio.ensure_future(
            self._clients.claims.claim(name, limit=limit, lease=task.lease or self.lease)
        )
        self._claiming = claiming
        try:
            claims = await claiming
        except asyncio.CancelledError:
            if cancelling():
                raise  # the worker's own task: a second signal, or its caller
            return Claims([])  # abandoned at the stop (_abandon_claim)
        finally:
            self._claiming = None
        elapsed = time.perf_counter() - started
        self.stats.claim_statements += 1
        self.stats.claim_seconds += elapsed
        self.stats.claimed += len(claims)
        if self.metrics is not None:
            _count_claim(self.metrics, name, elapsed, claims)
        if self._stopping.is_set() and claims:
            # It returned after the stop: nothing of it starts. Given back at once,
            # the attempt not counted (its lease would otherwise run out here, the
            # attempt counted, after a stop that waited on this very claim).
            await self._release_unstarted(claims)
            return Claims([])
        started_now = []
        traced = _tracing.active() if claims else False
        for claim in claims:
            context = JobContext(claim, self._clients.handlers, self._clients.handlers_async)
            attempt = self._attempts.add(claim, context, lease_from=sent, cancellable=task.is_async)
            self._runner.start(attempt, task, traced=traced)
            started_now.append(attempt)
        self._leases.attempts_started(started_now)
        return claims


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
