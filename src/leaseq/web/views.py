"""Formatting for the templates: ages, durations, bytes, times, and the geometry
of the small throughput chart. (The masking of secret payload fields, shared
with the CLI, is ``.._secret_fields``.)"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote

from .._durations import duration_text
from .._timeline import blocked_by


def age(seconds: float | None) -> str:
    """``42s``, ``3m 20s``, ``2h 5m``, ``3d 4h``; an em dash for None."""
    if seconds is None:
        return "—"
    sign = "-" if seconds < 0 else ""
    total = int(abs(seconds))
    if total < 60:
        return f"{sign}{abs(seconds):.0f}s"
    minutes, secs = divmod(total, 60)
    if minutes < 60:
        return f"{sign}{minutes}m {secs}s"
    hours, minutes = divmod(minutes, 60)
    if hours < 24:
        return f"{sign}{hours}h {minutes}m"
    days, hours = divmod(hours, 24)
    return f"{sign}{days}d {hours}h"


def duration(seconds: float | None) -> str:
    """A handler's run time: ``12 ms``, ``1.5 s``, then as :func:`age`."""
    if seconds is None:
        return "—"
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 60:
        return f"{seconds:.1f} s"
    return age(seconds)


def size(count: int | None) -> str:
    """Bytes as ``512 B``, ``1.5 KiB``, ``3.2 MiB``."""
    if count is None:
        return "—"
    value = float(count)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{count} B"  # pragma: no cover - the loop always returns


def when(moment: datetime | str | None) -> str:
    """A database time in UTC, to the second."""
    if moment is None:
        return "—"
    if isinstance(moment, str):
        try:
            parsed = datetime.fromisoformat(moment)
        except ValueError:
            return moment
        moment = parsed
    if moment.tzinfo is not None:
        moment = moment.astimezone(UTC)
    return moment.strftime("%Y-%m-%d %H:%M:%S UTC")


def number(value: int | None) -> str:
    return "—" if value is None else f"{value:,}"


def retention(seconds: float | None) -> str:
    """A retention or other setting in seconds: ``1d``, ``2h``, ``90s``; ``never``.

    Exact, in the form the settings form reads back (``1000000s``, ``1234.5678s``):
    the form shows these, and saving one field sends them all."""
    return duration_text(seconds)


def percent(part: int, whole: int | None) -> int | None:
    """How full a limit is, 0-100 (capped), or None without a limit."""
    if not whole:
        return None
    return min(100, round(100 * part / whole))


# -- the throughput chart -------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Bar:
    x: float
    width: float
    done_y: float
    done_height: float
    failed_y: float
    failed_height: float
    label: str


@dataclass(frozen=True, slots=True)
class Chart:
    width: int
    height: int
    bars: tuple[Bar, ...]
    peak: int
    done: int
    failed: int


def chart(minutes: Sequence[Any], *, width: int = 240, height: int = 44) -> Chart:
    """Stacked bars, one per minute (oldest left): done below, failed on top.

    ``minutes`` are ``ActivityMinute``s (``start``, ``done``, ``failed``); the
    template draws the rectangles as SVG, no script involved."""
    peak = max((m.done + m.failed for m in minutes), default=0)
    slot = width / max(len(minutes), 1)
    bars = []
    for index, minute in enumerate(minutes):
        scale = (height - 2) / peak if peak else 0.0
        done_height = minute.done * scale
        failed_height = minute.failed * scale
        done_y = height - done_height
        start = minute.start.astimezone(UTC).strftime("%H:%M") if minute.start else ""
        bars.append(
            Bar(
                x=round(index * slot, 2),
                width=round(max(slot - 1, 1), 2),
                done_y=round(done_y, 2),
                done_height=round(done_height, 2),
                failed_y=round(done_y - failed_height, 2),
                failed_height=round(failed_height, 2),
                label=f"{start} UTC: {minute.done} done, {minute.failed} failed",
            )
        )
    return Chart(
        width=width,
        height=height,
        bars=tuple(bars),
        peak=peak,
        done=sum(m.done for m in minutes),
        failed=sum(m.failed for m in minutes),
    )


#: Path segments a browser resolves away (the queue names "." and ".." are valid).
DOT_SEGMENTS = (".", "..")


def queue_path(name: str) -> str:
    """The path of queue ``name``'s page, as a browser asks for it: "." and ".." (queue
    names too) are dot segments, which a browser resolves away before asking (and
    percent-encoded ones as well); those go with a "~" before them, a character no
    queue name holds (``queue_name`` reads it back)."""
    segment = f"~{name}" if name in DOT_SEGMENTS else name
    return "/queues/" + quote(segment, safe="")


def queue_name(segment: str) -> str:
    """The queue a ``queue_path`` segment names."""
    return segment[1:] if segment.startswith("~") and segment[1:] in DOT_SEGMENTS else segment


def group_digest(error: str | None) -> str:
    """A Failed page group's identity, exactly its error text: the text itself
    cannot make the round trip through a form (a browser's HTML parser reads a CR
    as LF, and it sends line breaks as CRLF), so two groups whose texts differ
    only in line breaks would be one. An empty text and none are one group (the
    SQL's ``nullif``), "(no error text)"."""
    return hashlib.sha256((error or "").encode("utf-8", "surrogatepass")).hexdigest()


FILTERS = {
    "blocked_by": blocked_by,
    "group_digest": group_digest,
    "queue_path": queue_path,
    "age": age,
    "duration": duration,
    "size": size,
    "when": when,
    "number": number,
    "retention": retention,
}
