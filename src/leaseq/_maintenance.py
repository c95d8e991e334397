"""Maintenance with exactly one active instance per schema: the reaper.

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

    def __init__(self, queue: AsyncQueue, *, interval: float = 5.0, batch: int = 1000) -> None:
        self.queue = queue
        self.interval = interval
        self.batch = batch
        self.leading = False
        self.reaped = 0

    async def run(self) -> None:
        """Lead when possible, reap every ``interval`` seconds; never returns."""
        while True:
            try:
                async with self.queue._session() as session:
                    self.leading = await session.run(self.queue._store.maintenance_lock())
                    while self.leading:
                        await self._reap(session)
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
