"""The dashboard's shared, cached aggregates.

Overview, Failed and Blocked keys read aggregates (stats, activity, health,
failed groups, blocked keys) that cost the database a few statements each. One
:class:`SharedCache` per app keeps each for ``ttl`` seconds and runs at most one
load of a key at a time (single flight): a hundred open tabs refreshing every
few seconds cost the database what one does.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass
from typing import Any, TypeVar

import leaseq

T = TypeVar("T")

#: Blocked keys the shared summary lists (the Blocked keys page, the Overview's count);
#: one more is read, to tell that there are more.
BLOCKED_KEYS_READ = 100
#: Groups the Failed page lists (the largest); one more is read, to tell that there
#: are more.
FAILED_GROUPS_SHOWN = 50
#: Values a cache keeps at most. Keys hold what a request asked for (``?queue=``
#: of any text): without a bound, anyone could grow the process's memory.
CACHE_ENTRIES = 256


@dataclass
class _Load:
    """A load in flight and how many readers wait for it."""

    task: asyncio.Task[Any]
    readers: int = 0


class SharedCache:
    """Values by key for ``ttl`` seconds; concurrent misses of one key share one load.

    A failed load is not kept: the next request tries again (every waiter of the
    failed load sees its error). A load nobody waits for any more is cancelled:
    with the database away, each load would otherwise wait out a connect timeout
    in turn on the pool, and hold up the next page behind it.

    At most ``max_entries`` values are kept: adding one drops the expired ones, then
    the oldest while there are too many."""

    def __init__(
        self,
        ttl: float,
        clock: Callable[[], float] = time.monotonic,
        *,
        max_entries: int = CACHE_ENTRIES,
    ) -> None:
        self.ttl = ttl
        self._clock = clock
        self.max_entries = max_entries
        # In the order stored; with one ttl for all, also the order they expire in.
        self._values: dict[Hashable, tuple[float, Any]] = {}
        self._loading: dict[Hashable, _Load] = {}
        #: Moves on at each clear(): a load started before it does not keep its value.
        self._generation = 0

    def __len__(self) -> int:
        return len(self._values)

    def __contains__(self, key: Hashable) -> bool:
        return key in self._values

    @property
    def loading(self) -> int:
        """How many loads are in flight."""
        return len(self._loading)

    async def get(self, key: Hashable, load: Callable[[], Awaitable[T]]) -> T:
        kept = self._values.get(key)
        if kept is not None and self._clock() < kept[0]:
            value: T = kept[1]
            return value
        flight = self._loading.get(key)
        if flight is None:
            flight = _Load(asyncio.ensure_future(self._load(key, load, self._generation)))
            self._loading[key] = flight
        flight.readers += 1
        try:
            # A reader that goes away (a closed tab) must not cancel the others' load.
            result: T = await asyncio.shield(flight.task)
            return result
        finally:
            flight.readers -= 1
            if not flight.readers and not flight.task.done():
                self._forget(key, flight)
                flight.task.cancel()

    async def _load(self, key: Hashable, load: Callable[[], Awaitable[T]], generation: int) -> T:
        try:
            value = await load()
            if generation == self._generation:  # (else it may show what a clear undid)
                self._store(key, value)
            return value
        finally:
            flight = self._loading.get(key)
            if flight is not None and flight.task is asyncio.current_task():
                self._forget(key, flight)

    def _store(self, key: Hashable, value: Any) -> None:
        now = self._clock()
        self._values.pop(key, None)  # stored anew: it goes to the end
        values = self._values
        # The oldest first: expired ones, then any beyond the bound.
        while values and (len(values) >= self.max_entries or next(iter(values.values()))[0] <= now):
            del values[next(iter(values))]
        values[key] = (now + self.ttl, value)

    def _forget(self, key: Hashable, flight: _Load) -> None:
        # Only this load's entry: a cancelled one may end after a new load of its key began.
        if self._loading.get(key) is flight:
            del self._loading[key]

    def clear(self) -> None:
        """Forget every value (after an action, so its effect shows at once), and the
        loads in flight: they may have read the state from before the action, and a
        page asked for after it must not join them (their readers still get them)."""
        self._values.clear()
        self._loading.clear()
        self._generation += 1


class Aggregates:
    """The aggregates the pages share, read through one cache."""

    def __init__(self, client: leaseq.AsyncQueue, cache: SharedCache) -> None:
        self.client = client
        self.cache = cache

    async def stats(self) -> list[leaseq.QueueStats]:
        return await self.cache.get(("stats",), self.client.stats)

    async def queue_names(self) -> list[str]:
        # Not from stats(): that counts every queued job, 1.3 s a page at 1M queued.
        return await self.cache.get(("queue_names",), self.client.queue_names)

    async def settings(self, queue: str) -> leaseq.QueueSettings | None:
        return await self.cache.get(("settings", queue), lambda: self.client.queue_settings(queue))

    async def activity(self) -> dict[str, leaseq.QueueActivity]:
        """Per queue, its last hour of activity."""

        async def load() -> dict[str, leaseq.QueueActivity]:
            return {entry.queue: entry for entry in await self.client.activity(minutes=60)}

        return await self.cache.get(("activity",), load)

    async def activity_of(self, queues: list[str]) -> dict[str, leaseq.QueueActivity]:
        """The last hour of these queues only (a statement each, side by side)."""

        async def one(queue: str) -> list[leaseq.QueueActivity]:
            return await self.cache.get(
                ("activity", queue), lambda: self.client.activity(queue, minutes=60)
            )

        async with asyncio.TaskGroup() as group:
            loading = [group.create_task(one(queue)) for queue in queues]
        return {entry.queue: entry for task in loading for entry in task.result()}

    async def running(self, queue: str | None, limit: int) -> list[leaseq.Job]:
        """The running jobs, however old (the Running page refreshes every few
        seconds), the lease that ends first first."""
        return await self.cache.get(
            ("running", queue, limit),
            lambda: self.client.running_jobs(queue, limit=limit),
        )

    async def health(self) -> leaseq.Health:
        return await self.cache.get(("health",), self.client.health)

    async def schedules(self) -> list[leaseq.ScheduleInfo]:
        return await self.cache.get(("schedules",), self.client.schedules)

    async def failed_groups(self, queue: str | None) -> leaseq.FailedSummary:
        return await self.cache.get(
            ("failed_groups", queue),
            lambda: self.client.failed_groups(queue, limit=FAILED_GROUPS_SHOWN + 1),
        )

    async def blocked_keys(self, queue: str | None) -> list[leaseq.BlockedKey]:
        return await self.cache.get(
            ("blocked_keys", queue),
            lambda: self.client.blocked_keys(queue, limit=BLOCKED_KEYS_READ + 1),
        )
