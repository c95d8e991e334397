"""Periodic jobs as declared on an app: when each ticks, and which missed ticks to enqueue.

A schedule ticks on a cron expression (croniter; 5 fields, or 6 with seconds
last) in its own time zone, or every N seconds (aligned on the Unix epoch, so
every worker agrees on the ticks). Pure computation, no I/O: the
:mod:`.scheduler` asks it what is due between two database times.

Daylight saving time: a wall-clock time that does not exist (the hour skipped
in spring) ticks once, at the first time after it (croniter's rule); a
wall-clock time that happens twice (the hour repeated in autumn) ticks once, at
its first occurrence. So "0 2 * * *" runs once on every day of the year.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import CroniterError, croniter

from .. import _validate as validate
from .. import _validate_operators as operator_input
from .._errors import InvalidArgument


@dataclass(frozen=True, slots=True)
class Schedule:
    """One periodic job: its name, when it ticks, and the job each tick enqueues."""

    name: str
    queue: str
    payload: Any
    payload_text: str
    payload_bytes: int
    cron: str | None
    every: float | None
    tz: str
    #: Missed ticks this many seconds old or newer are enqueued after a downtime
    #: (the latest due tick always is); older ones are skipped and counted.
    catch_up: float
    priority: int
    max_attempts: int | None

    @property
    def spec(self) -> str:
        if self.cron is not None:
            return f"cron {self.cron}"
        assert self.every is not None
        # Short where that is exact (``every 60``), else every digit: a changed
        # interval must give a changed spec (1000001 was 1e+06, as 1000000 is).
        short = f"{self.every:g}"
        return f"every {short if float(short) == self.every else repr(self.every)}"

    def next_after(self, moment: datetime) -> datetime:
        """The first tick strictly after ``moment``."""
        return next(self._ticks(moment))

    def due(self, first: datetime, now: datetime) -> Due:
        """The ticks from ``first`` (the next unhandled tick) up to ``now``: which to
        enqueue (those within the catch-up window, and always the latest), how
        many to skip, and the first tick after them."""
        window = now - timedelta(seconds=self.catch_up)
        start = first - timedelta(microseconds=1)
        skipped = 0
        if self.every is not None:
            # Far behind an interval: jump over the ticks before the window.
            before_window = math.floor((window - first).total_seconds() / self.every)
            if before_window > 1:
                skipped = before_window - 1
                start += timedelta(seconds=skipped * self.every)
        chosen: list[datetime] = []
        latest: datetime | None = None
        for tick in self._ticks(start):
            if tick > now:
                break
            if latest is not None and latest < window:
                skipped += 1  # older than the window, and not the latest
            elif latest is not None:
                chosen.append(latest)
            latest = tick
        if latest is None:
            return Due((), skipped, self.next_after(now))
        return Due((*chosen, latest), skipped, self.next_after(latest))

    def idempotency_key(self, tick: datetime) -> str:
        """The job's key: stable for the tick, whichever worker enqueues it."""
        return f"{self.name}@{tick.astimezone(UTC).isoformat()}"

    def _ticks(self, after: datetime) -> Iterator[datetime]:
        """The ticks strictly after ``after``, in order, as aware UTC datetimes."""
        if self.every is not None:
            every = self.every
            n = math.floor(after.timestamp() / every) + 1
            while True:
                at = datetime.fromtimestamp(n * every, UTC)
                # Rounded to the microsecond, a fractional interval's tick may
                # come back to ``after`` itself: only those strictly after count.
                if at > after:
                    yield at
                n += 1
        assert self.cron is not None
        zone = ZoneInfo(self.tz)
        ticks = croniter(self.cron, after.astimezone(zone))
        while True:
            tick: datetime = ticks.get_next(datetime)
            if tick.fold == 1 and tick.replace(fold=0).utcoffset() != tick.utcoffset():
                continue  # the second pass of a repeated wall-clock time
            yield tick.astimezone(UTC)


@dataclass(frozen=True, slots=True)
class Due:
    """What one pass does with a schedule's due ticks."""

    enqueue: tuple[datetime, ...]
    skipped: int
    next_tick: datetime


#: A cron field drawn at random by croniter: ``R``, ``R(0-5)``, ``R/5``.
_RANDOM_FIELD = re.compile(r"R(?:$|[(/])", re.IGNORECASE)


def schedule(
    name: str,
    *,
    queue: str,
    cron: str | None,
    every: float | None,
    payload: Any,
    tz: str,
    catch_up: float,
    priority: int,
    max_attempts: int | None,
    max_payload_bytes: int = validate.DEFAULT_MAX_PAYLOAD_BYTES,
) -> Schedule:
    """A checked :class:`Schedule` (InvalidArgument for a bad declaration)."""
    name = operator_input.schedule_name(name)
    if (cron is None) == (every is None):
        raise InvalidArgument(f"schedule {name!r}: give cron or every, not both nor neither")
    if cron is not None and (
        not isinstance(cron, str)
        or len(cron.split()) not in (1, 5, 6)  # 1: a nickname such as @daily
        or not croniter.is_valid(cron)
    ):
        raise InvalidArgument(f"schedule {name!r}: not a cron expression: {cron!r}")
    if cron is not None and any(_RANDOM_FIELD.match(field) for field in cron.split()):
        # croniter's R draws a new value at each computation: workers (and one
        # worker's passes) would disagree on the ticks, and ticks would be lost.
        raise InvalidArgument(
            f"schedule {name!r}: {cron!r} has a random field (R); every worker must "
            "compute the same ticks: give the value"
        )
    if every is not None:
        every = validate.seconds(every, "every", 366 * 86400.0, allow_zero=False)
        if every < 1:
            raise InvalidArgument(f"schedule {name!r}: every must be at least 1 second")
    try:
        ZoneInfo(tz)
    except (ZoneInfoNotFoundError, ValueError, TypeError):
        raise InvalidArgument(f"schedule {name!r}: unknown time zone {tz!r}") from None
    encoded = validate.payload(payload, max_payload_bytes)
    try:
        checked = Schedule(
            name=name,
            queue=validate.queue_name(queue),
            payload=payload,
            payload_text=encoded.text,
            payload_bytes=encoded.size,
            cron=cron,
            every=every,
            tz=tz,
            catch_up=validate.seconds(catch_up, "catch_up", 366 * 86400.0),
            priority=validate.integer(priority, "priority", validate.PRIORITY_RANGE),
            max_attempts=None
            if max_attempts is None
            else validate.integer(max_attempts, "max_attempts", range(1, 1001)),
        )
        checked.next_after(datetime.now(UTC))
    except CroniterError as exc:  # a date it never reaches (30 February) included
        raise InvalidArgument(f"schedule {name!r}: {exc}") from None
    return checked
