"""Every worker runs its app's schedules: no leader that can double-fire or die silently.

Each pass looks which schedules are due (one statement), then handles each in
a transaction of its own that holds the schedule's row locked (SKIP LOCKED:
another worker skips a schedule being handled): the ticks due since the last
pass are computed (:mod:`.schedules`), the chosen ones enqueued with their tick
rows (the tick's primary key refuses a second job), the row advanced, and all
of it commits together. A worker that dies mid-pass rolls back its ticks and
their jobs together, and the next pass of any worker does them. A paused queue
keeps its schedules' bookkeeping going (ticks are counted as paused) but gets
no job. A full queue (BacklogFull) leaves the tick due: it is tried again at the
next pass, and skipped once it is older than the catch-up window. So does any
other refusal of one schedule's tick (its payload over its queue's limit), which
is logged once: the other schedules, and the worker, go on. Each tick's
enqueue is a savepoint, so a queue that fills up during a catch-up keeps the
jobs of the ticks before the refused one.
"""

from __future__ import annotations

import random

from .._async_client import AsyncConnection, AsyncQueue
from .._errors import BacklogFull, LeaseqError, TransientError
from .._logs import get_logger
from .._metrics import Metrics
from .._waiting import pause
from .schedules import Due, Schedule

log = get_logger("leaseq.worker")

#: What ``Scheduler._failing`` holds for a schedule whose queue is full (its
#: message's counts change at each pass: the error's text would not do).
FULL = "its queue is full"

#: The longest sleep between passes: a tick is enqueued at most this late
#: (plus a little jitter, so that the workers of an app do not all look at once).
PASS_INTERVAL = 0.5


class Scheduler:
    def __init__(
        self, queue: AsyncQueue, schedules: dict[str, Schedule], metrics: Metrics | None = None
    ) -> None:
        self._queue = queue
        self._schedules = schedules
        #: Where the ticks' jobs are counted (leaseq_jobs_enqueued_total), as a
        #: producer's enqueues are: the worker's own metrics.
        self._metrics = metrics
        self._registered = False
        #: The error each failing schedule last met (logged when it changes), or FULL.
        self._failing: dict[str, str] = {}

    async def run(self) -> None:
        """Never returns; a database error pauses the passes, never ends them."""
        while True:
            try:
                await self.run_once()
            except TransientError as exc:
                log.warning("schedules: %s; trying again", exc)
            await pause(PASS_INTERVAL * random.uniform(0.8, 1.0))

    async def _register(self) -> None:
        now = await self._queue._run(self._queue._store.clock_now())
        rows = [
            (s.name, s.queue, s.spec, s.tz, s.next_after(now)) for s in self._schedules.values()
        ]
        await self._queue._run(self._queue._store.register_schedules(rows))

    async def run_once(self) -> int:
        """One pass over the due schedules; how many jobs it enqueued. The first
        pass declares the schedules (their rows)."""
        if not self._registered:
            await self._register()
            self._registered = True
        store = self._queue._store
        due = await self._queue._run(store.due_schedules(list(self._schedules)))
        enqueued = 0
        for name in due:
            try:
                enqueued += await self._handle(self._schedules[name])
            except BacklogFull as exc:
                # Said once while it lasts, as the errors below: the next pass,
                # half a second on in every worker, would say it again.
                if self._failing.get(name) != FULL:
                    log.warning("schedule %s: %s; its tick stays due", name, exc)
                self._failing[name] = FULL
            except TransientError:
                raise  # the database: the whole pass waits (run)
            except LeaseqError as exc:
                # This schedule's own trouble (its payload over its queue's limit,
                # say): said once, its tick left due; the other schedules and the
                # worker go on. Every worker runs every schedule: ending the
                # service would stop every worker of the app, at every restart.
                if self._failing.get(name) != str(exc):
                    log.error("schedule %s: %s; its tick stays due", name, exc)
                self._failing[name] = str(exc)
            else:
                if self._failing.pop(name, None) is not None:
                    log.info("schedule %s: enqueues again", name)
        return enqueued

    async def _handle(self, schedule: Schedule) -> int:
        store = self._queue._store
        async with self._queue.connection() as conn, conn.transaction():
            taken = await self._queue._run(
                store.lock_schedule(
                    schedule.name, queue=schedule.queue, spec=schedule.spec, tz=schedule.tz
                ),
                conn,
            )
            if taken is None:
                return 0  # another worker has it, it is no longer due, or redeclared
            first, now, paused = taken
            due = schedule.due(first, now)
            handled, fired = (
                (len(due.enqueue), []) if paused else await self._fire(schedule, due, conn)
            )
            last_tick = due.enqueue[handled - 1] if handled else first
            # A tick a full queue refused is the next one due; else the first after the latest.
            next_tick = due.enqueue[handled] if handled < len(due.enqueue) else due.next_tick
            await self._queue._run(
                store.advance_schedule(
                    schedule.name,
                    last_tick=last_tick,
                    next_tick=next_tick,
                    enqueued=len(fired),
                    skipped=due.skipped,
                    paused=handled if paused else 0,
                    last_job_id=fired[-1] if fired else None,
                ),
                conn,
            )
        if fired and self._metrics is not None:  # committed
            self._metrics.queue(schedule.queue).enqueued.inc(len(fired))
        return len(fired)

    async def _fire(
        self, schedule: Schedule, due: Due, conn: AsyncConnection
    ) -> tuple[int, list[int]]:
        """Enqueue the due ticks in order: how many were handled, and the new
        jobs' ids (a tick that already has its job is handled without one).

        Each tick's enqueue is a savepoint: when the queue fills up during a
        catch-up, the ticks before keep their jobs and the refused tick stays
        due. A full queue at the first tick raises BacklogFull, and nothing of
        the pass is written."""
        store = self._queue._store
        fired: list[int] = []
        for handled, tick in enumerate(due.enqueue):
            try:
                async with conn.transaction():
                    job_id = await self._queue._run(
                        store.fire_tick(
                            schedule.name,
                            tick,
                            queue=schedule.queue,
                            payload_text=schedule.payload_text,
                            payload_bytes=schedule.payload_bytes,
                            priority=schedule.priority,
                            max_attempts=schedule.max_attempts,
                            idempotency_key=schedule.idempotency_key(tick),
                        ),
                        conn,
                    )
            except BacklogFull as exc:
                if handled == 0:
                    raise
                log.warning(
                    "schedule %s: %s; %d of its due ticks stay due",
                    schedule.name,
                    exc,
                    len(due.enqueue) - handled,
                )
                return handled, fired
            if job_id is not None:
                fired.append(job_id)
        return len(due.enqueue), fired
