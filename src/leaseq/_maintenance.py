"""Maintenance with exactly one active instance per schema: the reaper, then
retention, and the job table's vacuum when autovacuum is off.

Every worker may run it; the one that takes the schema's session advisory lock
leads, on a dedicated connection that it also reaps through, so leadership ends
the moment that session does (crash, network loss, server restart) and another
worker takes over. The server's end of that session probes its client (TCP
keepalives, maintenance_keepalive.sql): the session of a leader whose host
vanished ends within ~30 s, not after the OS's 2 hours. ``leaseq maintenance``
runs it as its own process.

Each round reaps, then applies the queues' retention (``AsyncQueue.prune``) one
bounded batch at a time, ``prune_pause`` seconds apart so that autovacuum keeps
up, for at most one ``interval``: a large backlog of finished jobs is worked off
over many rounds and never delays the next reaping by more than that. A batch
waits for a lock ``PRUNE_LOCK_WAIT_SECONDS`` at most, then is left for the next
round.

The jobs the reaper fails are counted (``leaseq_jobs_finished_total``, outcome
``failed``) on the leader's metrics: no worker counts them, theirs died with
them, and only the leader fails them, so a fleet counts each once.
"""

from __future__ import annotations

import asyncio
import math
import time

from . import _metrics, _migrate
from . import _validate as validate
from . import _validate_settings as validate_settings
from ._async_client import AsyncQueue
from ._db import Session
from ._errors import InvalidArgument, InvalidDatabaseURL, NotMigrated, TransientError
from ._health import TableCare
from ._logs import get_logger
from ._metrics import Metrics
from ._statement import Operation
from ._types import PruneResult, ReapResult
from ._waiting import pause

log = get_logger("leaseq.maintenance")

#: How often the leader vacuums the job table when autovacuum is off and dead
#: rows are not counted (``track_counts = off``): their count stays whatever it
#: was, and a vacuum does not reset it, so it can say neither "due" nor "done".
#: Often enough for the claim's index at thousands of jobs a second (autovacuum's
#: own naptime is a minute), rarely enough to cost little on a large table.
VACUUM_UNCOUNTED_SECONDS = 60.0

#: The longest interval between rounds (the worker's maintenance_interval's bound).
MAX_INTERVAL_SECONDS = 86400.0
#: The longest pause between retention batches (prune()'s own ``pause`` bound).
MAX_PRUNE_PAUSE_SECONDS = 3600.0
#: How long a retention batch of the leader waits for a lock at most: one held
#: for long (an operator's CREATE INDEX on the archive) leaves retention for the
#: next round, never holding up the reaper for as long as it lasts.
PRUNE_LOCK_WAIT_SECONDS = 1.0
#: How long the leader's VACUUM or ANALYZE of the job table waits for its lock at
#: most (an operator's own VACUUM or CREATE INDEX CONCURRENTLY holds it): past
#: that it is left for a later round, and the reaper goes on.
VACUUM_LOCK_WAIT_SECONDS = 1.0


class Maintenance:
    """The reaper and retention with one active instance per schema (see the
    module's docs): ``await Maintenance(queue).run()`` in a process of your own,
    or let workers run it (they do by default). ``retention=False`` only reaps."""

    def __init__(
        self,
        queue: AsyncQueue,
        *,
        interval: float = 5.0,
        batch: int = 1000,
        retention: bool = True,
        prune_pause: float = 0.1,
        vacuum: bool = True,
        metrics: Metrics | None = _metrics.DEFAULT,
    ) -> None:
        if not isinstance(queue, AsyncQueue):
            raise InvalidArgument(f"Maintenance runs on a leaseq.AsyncQueue, got {queue!r}")
        # Checked here, not at run(): an interval of 0 or less reaped in a busy loop,
        # a NaN one never again, and a bad batch failed only inside the loop.
        validate.seconds(interval, "interval", MAX_INTERVAL_SECONDS, allow_zero=False)
        # The batch is both reap()'s limit and prune()'s batch: within both bounds.
        validate_settings.prune_batch(batch)
        validate.claim_limit(batch, "batch")
        validate.seconds(prune_pause, "prune_pause", MAX_PRUNE_PAUSE_SECONDS)
        validate.flag(retention, "retention")
        validate.flag(vacuum, "vacuum")
        #: Where the jobs it fails are counted (None: nowhere).
        self.metrics = _metrics.checked(metrics)
        self.queue = queue
        self.interval = interval
        self.batch = batch
        self.retention = retention
        self.prune_pause = prune_pause
        #: Vacuum the job table when autovacuum is off for it (the server's setting
        #: or the table's) and its dead rows pass autovacuum's own threshold for it.
        self.vacuum = vacuum
        self.vacuums = 0
        self.analyzes = 0
        self.leading = False
        self.reaped = 0
        #: Jobs retention removed from the job table (deleted or archived) so far.
        self.pruned = 0
        self._warned_not_migrated = False
        #: Whether the leader said its retention waits for a lock (said once a spell).
        self._warned_lock_wait = False
        self._schema_checked = False
        #: When the next vacuum is due while dead rows are not counted.
        self._uncounted_vacuum_at = -math.inf
        #: Whether the leader said it may not vacuum the table (said once).
        self._told_not_ours = False
        #: Whether the leader said its vacuum waits for a lock (said once a spell).
        self._told_vacuum_waits = False

    async def run(self) -> None:
        """Lead when possible, reap and apply retention every ``interval`` seconds;
        never returns."""
        while True:
            try:
                async with self.queue._session() as session:
                    if not self._schema_checked:
                        # Its statements need this code's migrations: on a schema
                        # behind it they end in a missing column or function.
                        # Said before it changes anything, as a worker does
                        # (retried here while the database is away).
                        applied = await session.run(self.queue._store.migrations_applied())
                        _migrate.require_current(self.queue.schema, applied)
                        self._schema_checked = True
                    self.leading = await session.run(self.queue._store.maintenance_lock())
                    while self.leading:
                        await self._reap(session)
                        if self.retention:
                            await self._prune()
                        if self.vacuum:
                            await self._vacuum_if_due(session)
                        await pause(self.interval)
            except InvalidDatabaseURL:
                raise  # no retry can connect with it
            except TransientError as exc:
                log.warning("maintenance connection lost (%s)", exc)
            finally:
                self.leading = False
            await pause(self.interval)

    async def _reap(self, session: Session) -> None:
        while True:  # bounded batches until nothing is left
            result: ReapResult = await session.run(self.queue._store.reap(limit=self.batch))
            if result:
                self.reaped += len(result)
                if self.metrics is not None:
                    for queue, count in result.by_queue.items():
                        self.metrics.queue(queue).finished["failed"].inc(count)
                log.info("reaper failed %d exhausted jobs: %s", len(result), list(result.failed))
            if len(result) < self.batch:
                return

    async def _vacuum_if_due(self, session: Session) -> None:
        # Without autovacuum nothing removes the dead rows that every claim and
        # completion leaves at the head of the ready index, and claims slow down
        # as they step over them; nor does anything analyze a growing backlog.
        # One cheap statistics read per pass decides.
        care = await session.run(self.queue._store.vacuum_check())
        if care is TableCare.NOT_OURS:
            if not self._told_not_ours:
                self._told_not_ours = True
                log.warning(
                    "%s.job needs a vacuum or an analyze and autovacuum is off for it, but "
                    "only its owner may run them (this leader's role may not): run "
                    "the leader as the owner, or turn autovacuum on",
                    self.queue.schema,
                )
            return
        if care is TableCare.UNCOUNTED:  # on a timer, from the first pass
            now = time.monotonic()
            if now < self._uncounted_vacuum_at:
                return
            self._uncounted_vacuum_at = now + VACUUM_UNCOUNTED_SECONDS
            care = TableCare.VACUUM
        if care is TableCare.VACUUM:
            if await self._with_lock_wait(session, self.queue._store.vacuum_job()):
                self.vacuums += 1
                log.info("vacuumed %s.job: autovacuum is off for it", self.queue.schema)
        elif care is TableCare.ANALYZE and await self._with_lock_wait(
            session, self.queue._store.analyze_job()
        ):
            self.analyzes += 1
            log.info("analyzed %s.job: autovacuum is off for it", self.queue.schema)

    async def _with_lock_wait(self, session: Session, operation: Operation[None]) -> bool:
        """Run the VACUUM or ANALYZE ``operation``, waiting for the table's lock
        VACUUM_LOCK_WAIT_SECONDS at most: True if it ran, False if left for later."""
        store = self.queue._store
        await session.run(store.vacuum_lock_timeout(VACUUM_LOCK_WAIT_SECONDS))
        try:
            await session.run(operation)
        except TransientError as exc:
            # The wait given up (or the session lost: then the reset below says so).
            if not self._told_vacuum_waits:
                log.warning("vacuum of %s.job left for later (%s)", self.queue.schema, exc)
                self._told_vacuum_waits = True
            ran = False
        else:
            self._told_vacuum_waits = False
            ran = True
        # Not in a `finally`: a cancelled task leaves, and its session closes with it.
        await session.run(store.vacuum_lock_timeout(None))
        return ran

    async def _prune(self) -> None:
        """Retention batches until nothing is due, for one interval at most."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.interval
        batch = self.queue._store.prune(limit=self.batch, lock_timeout=PRUNE_LOCK_WAIT_SECONDS)
        while True:
            try:
                result = await self.queue._run(batch)
            except NotMigrated as exc:
                # A schema whose retention columns are gone though its migrations
                # are recorded (edited by hand): keep reaping, say it once.
                if not self._warned_not_migrated:
                    log.warning("retention waits for `leaseq migrate` (%s)", exc)
                    self._warned_not_migrated = True
                return
            except TransientError as exc:
                # A lock it waited for too long (nothing written), or the database
                # away: the reaper goes on (on its own session), retention next round.
                if not self._warned_lock_wait:
                    log.warning("retention left for the next round (%s)", exc)
                    self._warned_lock_wait = True
                return
            self._warned_lock_wait = False
            self._log(result)
            if not result.more or loop.time() >= deadline:
                return
            await pause(self.prune_pause)

    def _log(self, result: PruneResult) -> None:
        self.pruned += len(result)
        for what, counts in (
            ("deleted", result.deleted),
            ("archived", result.archived),
            ("deleted from the archive", result.expired),
        ):
            if counts:
                described = ", ".join(f"{q}/{s.value}: {n}" for (q, s), n in sorted(counts.items()))
                log.info("retention %s %d jobs (%s)", what, sum(counts.values()), described)
