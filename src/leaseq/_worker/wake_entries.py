"""The worker's wake-up entries: an enqueue notifies only while some worker waits
for a notification on its queue (migration 0020), so this worker says when it does.

A claim of a queue that comes back short means the worker now waits for a hint
about it (:mod:`.hints`). It enters itself in the queue's row (``waiter_enter``:
``queue.waiting``, which every enqueue's ``admit()`` reads) and takes a fence, a
transaction id given after the entry committed. Until every
transaction below the fence has ended the entry is *settling*: a producer that
read "nobody waits" before the entry was visible may commit after this
worker's last claim, and send nothing. So while settling the queue is asked
again soon (5 ms, doubling up to the poll interval), each claim preceded by a
check of the fence; the first claim after it is passed sees every such job.
A producer that read the entry notifies as before.

Busy, a worker needs no notification: it claims again as its slots free up.
So it leaves a queue (``waiter_leave``) once the queue's claims have come back
full for ``LINGER`` seconds (with every worker busy, producers send no NOTIFY:
PostgreSQL serialises notifying commits). Entries expire unless moved on
(``keep_fresh``); the reaper removes those of killed workers. A worker that
does not listen (``listen=False``, a burst) enters nothing.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import socket
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from .._async_client import AsyncQueue
from .._errors import TransientError
from .._logs import get_logger

log = get_logger("leaseq.worker")

#: Seconds of claims that came back full before the worker leaves a queue: going
#: back and forth costs an entry and a fence each time (two commits).
LINGER = 2.0
#: How long an entry lives unless moved on; the worker moves its entries on four
#: times per lifetime.
ENTRY_SECONDS = 120.0
#: The first wait before asking a settling queue again.
SETTLE_FIRST_WAIT = 0.005


@dataclass(slots=True)
class _Entry:
    #: A transaction id given after the entry committed; None once every
    #: transaction below it has ended (settled).
    fence: int | None
    #: Settling: how long to wait before the next claim of the queue.
    wait: float
    #: When a claim of the queue last came back short (monotonic).
    short_at: float


class WakeEntries:
    def __init__(
        self, client: AsyncQueue, queues: Sequence[str], *, poll_interval: float, enabled: bool
    ) -> None:
        self._client = client
        self._queues = tuple(queues)
        self._poll_interval = poll_interval
        self.enabled = enabled
        #: Its rows' name: host, process and a random part (two Workers in one process).
        self.worker = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"
        self._seconds = ENTRY_SECONDS
        self._entered: dict[str, _Entry] = {}

    def settling(self, queue: str) -> bool:
        """Whether ``queue``'s entry waits for its fence (checked before each claim)."""
        entry = self._entered.get(queue)
        return entry is not None and entry.fence is not None

    async def check_fence(self, queue: str) -> None:
        """Before a settling queue's claim: if every transaction below the fence has
        ended, that claim sees the jobs of every producer that missed the entry."""
        entry = self._entered.get(queue)
        if entry is None or entry.fence is None:
            return
        if await self._client._run(self._client._store.waiter_settled(entry.fence)):
            entry.fence = None

    def must_write(self, queue: str, short: bool) -> bool:
        """Whether a claim of ``queue`` that came back (``short``: with less than it
        asked for) enters the queue, or leaves it: :meth:`write`."""
        if not self.enabled:
            return False
        entry = self._entered.get(queue)
        if short:
            return entry is None
        return entry is not None and time.monotonic() - entry.short_at >= LINGER

    async def write(self, queue: str, short: bool) -> float | None:
        """Enter ``queue`` (short) or leave it; when to ask it again (None: as the
        hints say)."""
        store = self._client._store
        if not short:
            self._entered.pop(queue, None)  # (keep_fresh may have dropped it meanwhile)
            await self._client._run(store.waiter_leave([queue], self.worker))
            return None
        await self._client._run(store.waiter_enter([queue], self.worker, self._seconds))
        fence = await self._client._run(store.waiter_fence())
        self._entered[queue] = _Entry(fence, SETTLE_FIRST_WAIT, time.monotonic())
        return SETTLE_FIRST_WAIT

    def claimed(self, queue: str, short: bool) -> float | None:
        """A claim of ``queue`` came back that writes nothing (:meth:`must_write`):
        when to ask the queue again whatever the hints say (None: as they say)."""
        entry = self._entered.get(queue)
        if entry is None or not short:
            return None
        entry.short_at = time.monotonic()
        if entry.fence is None:
            return None
        wait = entry.wait
        entry.wait = min(wait * 2, self._poll_interval)
        return wait

    def forget(self) -> None:
        """The listener (re)connected: what it missed is unknown, and so is whether
        the entries outlived what took it away. The next short claims enter again."""
        self._entered.clear()

    async def keep_fresh(self, lost: Callable[[str], None]) -> None:
        """Move the entries on, for ever; ``lost(queue)`` for an entry found gone
        (the reaper took it while the database was away): claim it again soon."""
        while True:
            await asyncio.sleep(self._seconds / 4)
            if not self._entered:
                continue
            refresh = self._client._store.waiter_refresh(self._queues, self.worker, self._seconds)
            try:
                still = await self._client._run(refresh)
            except TransientError as exc:
                log.info("wake-up entries not moved on (%s); trying again later", exc)
                continue
            for queue in list(self._entered):
                if queue not in still:
                    del self._entered[queue]
                    lost(queue)

    async def leave_all(self) -> None:
        """At a stop: enqueues need not notify for this worker any more (every queue:
        an entry forgotten at a reconnect may still be there)."""
        if self.enabled:
            self._entered.clear()
            await self._client._run(self._client._store.waiter_leave(self._queues, self.worker))
