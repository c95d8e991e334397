"""Maintenance with exactly one active instance per schema: the reaper, and the
job table's vacuum when autovacuum is off.

Every worker may run it; the one that takes the schema's session advisory lock
leads, on a dedicated connection that it also reaps through, so leadership ends
the moment that session does (crash, network loss, server restart) and another
worker takes over. ``leaseq maintenance`` runs it as its own process.
"""

from __future__ import annotations

import asyncio

from ._async_client import AsyncQueue
from ._db import Session
from ._errors import TransientError
from ._logs import get_logger
from ._types import ReapResult

log = get_logger("leaseq.maintenance")


class Maintenance:
    """The reaper with one active instance per schema (see the module's docs):
    ``await Maintenance(queue).run()`` in a process of your own, or let workers
    run it (they do by default)."""

    def __init__(
        self, queue: AsyncQueue, *, interval: float = 5.0, batch: int = 1000, vacuum: bool = True
    ) -> None:
        self.queue = queue
        self.interval = interval
        self.batch = batch
        #: Vacuum the job table when autovacuum is off for it (the server's setting
        #: or the table's) and its dead rows pass autovacuum's own threshold for it.
        self.vacuum = vacuum
        self.leading = False
        self.reaped = 0
        self.vacuums = 0

    async def run(self) -> None:
        """Lead when possible, reap every ``interval`` seconds; never returns."""
        while True:
            try:
                async with self.queue._session() as session:
                    self.leading = await session.run(self.queue._store.maintenance_lock())
                    while self.leading:
                        await self._reap(session)
                        if self.vacuum:
                            await self._vacuum_if_due(session)
                        await asyncio.sleep(self.interval)
            except TransientError as exc:
                log.warning("maintenance connection lost (%s)", exc)
            finally:
                self.leading = False
            await asyncio.sleep(self.interval)

    async def _reap(self, session: Session) -> None:
        while True:  # bounded batches until nothing is left
            result: ReapResult = await session.run(self.queue._store.reap(limit=self.batch))
            if result:
                self.reaped += len(result)
                log.info("reaper failed %d exhausted jobs: %s", len(result), list(result.failed))
            if len(result) < self.batch:
                return

    async def _vacuum_if_due(self, session: Session) -> None:
        # Without autovacuum nothing removes the dead rows that every claim and
        # completion leaves at the head of the ready index, and claims slow down
        # as they step over them. One cheap statistics read per pass decides.
        if await session.run(self.queue._store.vacuum_check()):
            await session.run(self.queue._store.vacuum_job())
            self.vacuums += 1
            log.info("vacuumed %s.job: autovacuum is off for it", self.queue.schema)
