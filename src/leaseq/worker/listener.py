"""LISTEN for enqueue notifications: a wake-up hint, re-established after every loss."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from .. import db
from ..logs import get_logger
from ..statement import Statement
from .state import WorkerStats

log = get_logger("leaseq.worker")


async def listen_for_work(
    dsn: str,
    listen: Statement,
    queues: set[str],
    *,
    wake: Callable[[], None],
    stats: WorkerStats,
) -> None:
    """Call ``wake`` for every notification about one of ``queues``; never returns.

    Polling runs behind this regardless, so a lost connection delays nothing by
    more than a poll interval; after each reconnect ``wake`` is called once to
    pick up what was enqueued meanwhile.
    """
    delay = 0.1
    while True:
        try:
            async for payload in db.listen(dsn, listen):
                delay = 0.1
                if payload == "" or payload in queues:  # "": (re)connected
                    wake()
        except Exception as exc:
            if not db.is_connection_error(exc):
                raise
            log.info("LISTEN connection lost (%s); reconnecting", exc)
        stats.listen_reconnects += 1
        await asyncio.sleep(delay)
        delay = min(delay * 2, 5.0)
