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
next pass, and skipped once it is older than the catch-up window.
"""

from __future__ import annotations

import random

from .._async_client import AsyncQueue
from .._errors import BacklogFull, TransientError
from .._logs import get_logger
from .._waiting import pause
from .schedules import Schedule

log = get_logger("leaseq.worker")

#: The longest sleep between passes: a tick is enqueued at most this late
#: (plus a little jitter, so that the workers of an app do not all look at once).
PASS_INTERVAL = 0.5


class Scheduler:
    def __init__(self, queue: AsyncQueue, schedules: dict[str, Schedule]) -> None:
        self._queue = queue
        self._schedules = schedules
        self._registered = False

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
                log.warning("schedule %s: %s; its tick stays due", name, exc)
        return enqueued

    async def _handle(self, schedule: Schedule) -> int:
        store = self._queue._store
        async with self._queue.connection() as conn, conn.transaction():
            taken = await self._queue._run(store.lock_schedule(schedule.name), conn)
            if taken is None:
                return 0  # another worker has it, or it is no longer due
            first, now, paused = taken
            due = schedule.due(first, now)
            fired: list[int] = []
            if not paused:
                for tick in due.enqueue:
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
                    if job_id is not None:
                        fired.append(job_id)
            last_tick = due.enqueue[-1] if due.enqueue else first
            await self._queue._run(
                store.advance_schedule(
                    schedule.name,
                    last_tick=last_tick,
                    next_tick=due.next_tick,
                    enqueued=len(fired),
                    skipped=due.skipped,
                    paused=len(due.enqueue) if paused else 0,
                    last_job_id=fired[-1] if fired else None,
                ),
                conn,
            )
        return len(fired)
