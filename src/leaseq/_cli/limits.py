"""Option callbacks for a queue's limits: ``--max-running 5``, ``--rate-limit 50/1s``
(``none`` lifts a limit), and how a limit is shown."""

from __future__ import annotations

from typing import Any

import click

from .retention import NEVER, duration, format_duration

_LIFTED = ("none", "off", "never")


def running_limit(ctx: click.Context, param: click.Parameter, value: str | None) -> Any:
    """A number of running jobs, or ``none`` (``NEVER``: the limit is lifted)."""
    if value is None:
        return None
    text = value.strip().lower()
    if text in _LIFTED:
        return NEVER
    if not text.isdigit():
        raise click.BadParameter(f"{value!r} is not a number of jobs, or none", ctx, param)
    return int(text)


def rate_limit(ctx: click.Context, param: click.Parameter, value: str | None) -> Any:
    """``STARTS/DURATION`` (``50/1s``, ``1000/1h``; a bare ``50`` is per second), or
    ``none``; as ``configure_queue`` takes it: ``(starts, seconds)``."""
    if value is None:
        return None
    text = value.strip().lower()
    if text in _LIFTED:
        return NEVER
    starts, _, per = text.partition("/")
    if not starts.isdigit():
        raise click.BadParameter(f"{value!r} is not STARTS/DURATION such as 50/1s", ctx, param)
    seconds = duration()(ctx, param, per or "1s")
    return (int(starts), seconds)


def format_rate(rate: tuple[int, float] | None) -> str:
    return NEVER if rate is None else f"{rate[0]}/{format_duration(rate[1])}"
