"""Helpers for tests of code that uses leaseq (and for leaseq's own tests)."""

from __future__ import annotations

from ._async_client import AsyncQueue
from ._sync_client import Queue


def set_clock_offset(queue: Queue, offset_seconds: float) -> None:
    """Move the schema's clock ``offset_seconds`` ahead of the server's time.

    Every lease, delay and expiry in leaseq reads this clock, so a test can
    expire a lease or reach a delayed job without sleeping. The offset is
    absolute (not cumulative) and applies to every connection at once.
    """
    queue._db.run(queue._store.set_clock_offset(offset_seconds))


async def aset_clock_offset(queue: AsyncQueue, offset_seconds: float) -> None:
    await queue._db.run(queue._store.set_clock_offset(offset_seconds))
