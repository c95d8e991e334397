"""Option callbacks for a queue's limits: ``--max-running 5``, ``--rate-limit 50/1s``
(``none`` lifts a limit), and how a limit is shown."""

from __future__ import annotations

from typing import Any

import click

from .retention import duration, format_duration

#: What a lifted limit is, read and printed: ``none`` (not retention's ``never``,
#: which read as "never runs" beside a limit).
NO_LIMIT = "none"
_LIFTED = (NO_LIMIT, "off", "never")
#: ``int()`` refuses more than 4300 digits; no limit needs a fraction of that.
MAX_DIGITS = 4000


def digits(text: str) -> bool:
    """Whether ``int(text)`` reads ``text`` as written: ASCII digits only (``str.isdigit``
    also accepts ``²``, which ``int()`` refuses, and other scripts' digits, which it
    reads), and not so many that ``int()`` refuses them."""
    return 0 < len(text) <= MAX_DIGITS and text.isascii() and text.isdigit()


def count_limit(unit: str) -> Any:
    """An option callback reading a limit counted in ``unit`` (jobs, bytes), or
    ``none`` (``NO_LIMIT``: the limit is lifted)."""

    def convert(ctx: click.Context, param: click.Parameter, value: str | None) -> Any:
        if value is None:
            return None
        text = value.strip().lower()
        if text in _LIFTED:
            return NO_LIMIT
        if not digits(text):
            raise click.BadParameter(f"{value!r} is not a number of {unit}, or none", ctx, param)
        return int(text)

    return convert


#: A number of running jobs, or ``none``.
running_limit = count_limit("jobs")


def rate_limit(ctx: click.Context, param: click.Parameter, value: str | None) -> Any:
    """``STARTS/DURATION`` (``50/1s``, ``1000/1h``; a bare ``50`` is per second), or
    ``none``; as ``configure_queue`` takes it: ``(starts, seconds)``."""
    if value is None:
        return None
    text = value.strip().lower()
    if text in _LIFTED:
        return NO_LIMIT
    starts, slash, per = text.partition("/")
    starts = starts.strip()
    # ("50/" is a period left out, not "per second": only a bare 50 means that.)
    if not digits(starts) or (slash and not per.strip()):
        raise click.BadParameter(f"{value!r} is not STARTS/DURATION such as 50/1s", ctx, param)
    seconds = duration()(ctx, param, per if slash else "1s")
    return (int(starts), seconds)


def format_limit(limit: int | None) -> str:
    """A count limit as ``queue configure`` prints it: ``none`` when there is none."""
    return NO_LIMIT if limit is None else str(limit)


def format_rate(rate: tuple[int, float] | None) -> str:
    return NO_LIMIT if rate is None else f"{rate[0]}/{format_duration(rate[1])}"
