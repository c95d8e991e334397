"""Periodic jobs as declared on an app: when each ticks, and which missed ticks to enqueue.

A schedule ticks on a cron expression (croniter; 5 fields, or 6 with seconds
last) in its own time zone, or every N seconds (aligned on the Unix epoch, so
every worker agrees on the ticks). Pure computation, no I/O: the
:mod:`.scheduler` asks it what is due between two database times.

Daylight saving time, as cron does it (croniter's rule): a schedule whose hour
field names the hour skipped in spring ticks once for it, at the first time
after the gap; one that ticks every hour has no tick in that hour and keeps
its real-time spacing. A wall-clock time that happens twice (the hour repeated
in autumn) ticks once, at its first occurrence. So "0 2 * * *" runs once on
every day of the year, and "30 * * * *" once every real hour but one: none in
the repeated hour (02:30 CEST, then 03:30 CET, two real hours later).
"""

from __future__ import annotations

import bisect
import functools
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
from .. import _validate_payloads as payload_checks
from .._errors import InvalidArgument

#: The hours a cron's skipped ticks are counted in, one croniter call each; past
#: this many (41 days of a cron that ticks every hour), the count is extrapolated.
HOURS_COUNTED = 1_000
#: The most ticks one pass enqueues for a schedule (a long catch-up window of a
#: dense schedule): the rest stay due, for the next pass half a second later.
TICKS_PER_PASS = 1_000


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
        many to skip, and the first tick after them.

        It runs on the worker's event loop, so its work is bounded whatever the
        downtime: the ticks before the window are jumped over and counted hour
        by hour (:meth:`_count`), and at most :data:`TICKS_PER_PASS` ticks are
        chosen; the rest stay due for the next pass."""
        window = now - timedelta(seconds=self.catch_up)
        start, skipped = self._jump_to_window(first, window)
        chosen: list[datetime] = []
        latest: datetime | None = None
        for tick in self._ticks(start):
            if tick > now:
                break
            if latest is not None and latest < window:
                skipped += 1  # older than the window, and not the latest
            elif latest is not None:
                chosen.append(latest)
                if len(chosen) == TICKS_PER_PASS:
                    return Due(tuple(chosen), skipped, tick)  # the rest next pass
            latest = tick
        if latest is None:
            return Due((), skipped, self.next_after(now))
        return Due((*chosen, latest), skipped, self.next_after(latest))

    def _jump_to_window(self, first: datetime, window: datetime) -> tuple[datetime, int]:
        """Where to start walking the ticks (just before the last tick before the
        window, when ``first`` is older), and how many ticks that jump skipped."""
        start = first - timedelta(microseconds=1)
        if self.every is not None:
            before_window = math.floor((window - first).total_seconds() / self.every)
            if before_window > 1:
                skipped = before_window - 1
                # Just before that tick as _ticks rounds it (first's own number,
                # plus those skipped): first plus the skipped time, rounded on its
                # own, may land on or past it, and that tick was neither walked nor
                # counted.
                number = math.floor(start.timestamp() / self.every) + 1 + skipped
                tick = datetime.fromtimestamp(number * self.every, UTC)
                return tick - timedelta(microseconds=1), skipped
            return start, 0
        assert self.cron is not None
        zone = ZoneInfo(self.tz)
        earlier = croniter(self.cron, window.astimezone(zone))
        while True:
            local: datetime = earlier.get_prev(datetime)
            # Not the second pass of a repeated wall-clock time: no tick of
            # _ticks, and a jump to it skipped the latest tick before it (the
            # one a downtime across the autumn's repeated hour must enqueue).
            if not _repeated(local):
                break
        last_before = local.astimezone(UTC)
        if last_before <= first:
            return start, 0
        return last_before - timedelta(microseconds=1), self._count(first, last_before)

    def _count(self, first: datetime, end: datetime) -> int:
        """How many cron ticks fall in [first, end), without walking each: the
        minutes and seconds a cron ticks at are the same in every hour it ticks
        in, so each such hour is counted at once, and croniter only finds the
        next one (~30 µs a call: a tick a second ten days behind, walked tick by
        tick, stalled the worker for half a minute). An hour that a change of
        UTC offset cuts (daylight saving time) is walked. Past
        :data:`HOURS_COUNTED` hours the rest is extrapolated at the rate
        counted so far."""
        cron = self.cron
        assert cron is not None  # (an interval's ticks are counted by arithmetic)
        zone = ZoneInfo(self.tz)
        offsets = _offsets_in_hour(cron)
        ticks = self._ticks(first - timedelta(microseconds=1))
        tick, counted, hours = next(ticks), 0, 0
        while tick < end:
            if hours == HOURS_COUNTED:
                return round(counted * (end - first) / (tick - first))
            hours += 1
            local = tick.astimezone(zone)
            hour_start = local.replace(minute=0, second=0, microsecond=0)
            hour_end = hour_start.astimezone(UTC) + timedelta(hours=1)
            since = local.minute * 60 + local.second
            last_instant = (hour_end - timedelta(microseconds=1)).astimezone(zone)
            at = bisect.bisect_left(offsets, since)
            on_offset = at < len(offsets) and offsets[at] == since
            if (
                not on_offset
                or hour_start.utcoffset() != last_instant.utcoffset()
                or not _ticks_in_hour(cron, hour_start.replace(tzinfo=None))
            ):
                # A tick moved out of a skipped wall-clock time (into an hour of
                # the cron's or not, at one of its offsets or not), or an hour a
                # change of UTC offset cuts: croniter's own ticks, one by one.
                while tick < min(hour_end, end):
                    counted += 1
                    tick = next(ticks)
                continue
            until = (min(hour_end, end) - hour_start).total_seconds()
            counted += bisect.bisect_left(offsets, until) - at
            ticks = self._ticks(hour_end - timedelta(microseconds=1))
            tick = next(ticks)
        return counted

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
            if _repeated(tick):
                continue  # the second pass of a repeated wall-clock time
            yield tick.astimezone(UTC)


def _repeated(local: datetime) -> bool:
    """Whether ``local`` (croniter's, in the schedule's zone) is the second pass
    of a wall-clock time that happens twice (fall back): no tick is there."""
    return local.fold == 1 and local.replace(fold=0).utcoffset() != local.utcoffset()


@functools.lru_cache(maxsize=256)
def _ticks_in_hour(cron: str, naive: datetime) -> bool:
    """Whether ``cron`` ticks in this wall-clock hour by its own fields (naive: no
    change of offset moves a tick in or out of it here). Cached by the naive hour:
    aware datetimes of two zones are equal at the same instant, and London's 02:00
    would get the answer for Paris's 03:00."""
    first: datetime = croniter(cron, naive - timedelta(microseconds=1)).get_next(datetime)
    return first < naive + timedelta(hours=1)


def _offsets_in_hour(cron: str) -> tuple[float, ...]:
    """The seconds past the hour at which ``cron`` ticks, in any hour it ticks in
    (its minute and second fields do not depend on the hour or the day)."""
    ticks = croniter(cron, datetime(2001, 1, 1, tzinfo=UTC))
    hour = ticks.get_next(datetime).replace(minute=0, second=0, microsecond=0)
    ticks = croniter(cron, hour - timedelta(microseconds=1))
    offsets: list[float] = []
    while (tick := ticks.get_next(datetime)) < hour + timedelta(hours=1):
        offsets.append((tick - hour).total_seconds())
    return tuple(offsets)


@dataclass(frozen=True, slots=True)
class Due:
    """What one pass does with a schedule's due ticks."""

    enqueue: tuple[datetime, ...]
    skipped: int
    next_tick: datetime


#: Zone keys the system's tz database resolves to the host's own zone.
_HOST_ZONES = frozenset({"localtime", "posixrules"})

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
    max_payload_bytes: int = payload_checks.DEFAULT_MAX_PAYLOAD_BYTES,
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
    if isinstance(tz, str) and tz.lower() in _HOST_ZONES:
        # Each host's own zone (a link to /etc/localtime): workers on hosts of
        # other zones would compute other ticks.
        raise InvalidArgument(
            f"schedule {name!r}: time zone {tz!r} is each host's own; every worker "
            "must compute the same ticks: name the zone (Europe/Paris, UTC)"
        )
    try:
        ZoneInfo(tz)
    except (ZoneInfoNotFoundError, ValueError, TypeError):
        raise InvalidArgument(f"schedule {name!r}: unknown time zone {tz!r}") from None
    encoded = payload_checks.payload(payload, max_payload_bytes)
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
