"""Checks of queue settings and retention arguments (configure_queue, prune),
run before anything is sent: bad input writes nothing."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from ._errors import InvalidArgument
from ._types import JobStatus, OrderingPolicy, RetentionMode
from ._validate import (
    FINISHED_STATES,
    MAX_PRUNE_BATCH,
    MAX_RETENTION_SECONDS,
    lease_seconds,
    seconds,
    within,
)
from ._validate_payloads import MAX_PAYLOAD_BYTES_CAP

_UNSET: Any = object()

# configure_queue's keyword -> (SQL parameter, validator)
_SETTINGS: dict[str, tuple[str, Callable[[Any], Any]]] = {
    "lease": ("lease", lease_seconds),
    "max_attempts": ("max_attempts", lambda v: _setting_int(v, "max_attempts", range(1, 1001))),
    "backoff_base": ("backoff_base", lambda v: seconds(v, "backoff_base", 86400.0)),
    "backoff_cap": ("backoff_cap", lambda v: seconds(v, "backoff_cap", 30 * 86400.0)),
    "ordering_policy": ("ordering_policy", lambda v: _policy(v).value),
    "max_queued_jobs": ("max_queued_jobs", lambda v: _limit(v, "max_queued_jobs", 2**62)),
    "max_queued_bytes": ("max_queued_bytes", lambda v: _limit(v, "max_queued_bytes", 2**62)),
    "max_payload_bytes": (
        "max_payload_bytes",
        lambda v: _limit(v, "max_payload_bytes", MAX_PAYLOAD_BYTES_CAP),
    ),
    "paused": ("paused", lambda v: _flag(v, "paused")),
    "retain_done": ("retain_done", lambda v: retention(v, "retain_done")),
    "retain_cancelled": ("retain_cancelled", lambda v: retention(v, "retain_cancelled")),
    "retain_failed": ("retain_failed", lambda v: retention(v, "retain_failed")),
    "retention_mode": ("retention_mode", lambda v: _retention_mode(v).value),
    "retain_archived": ("retain_archived", lambda v: retention(v, "retain_archived")),
    "max_running": ("max_running", lambda v: _limit(v, "max_running", MAX_RUNNING)),
    "max_running_per_group": (
        "max_running_per_group",
        lambda v: _limit(v, "max_running_per_group", MAX_RUNNING),
    ),
    "rate_limit": ("rate_limit", lambda v: rate_limit(v, "rate_limit")),
    "rate_limit_per_group": (
        "rate_limit_per_group",
        lambda v: rate_limit(v, "rate_limit_per_group"),
    ),
}

#: The largest concurrency limit, and the largest rate limit's count and period.
MAX_RUNNING = 1_000_000
MAX_RATE = 1_000_000
MAX_RATE_PERIOD = 30 * 86400.0
#: The shortest rate period: the claim counts starts in slots of 1/128 of the
#: period on the database's clock, which tells microseconds apart; a period of
#: 1e-300 s even overflowed that arithmetic, and every claim of the queue failed.
MIN_RATE_PERIOD = 0.001


def _setting_int(value: Any, what: str, allowed: range) -> int:
    if not isinstance(value, int) or not within(value, allowed):
        raise InvalidArgument(f"{what} must be an integer in [{allowed.start}, {allowed.stop - 1}]")
    return int(value)


def _limit(value: Any, what: str, maximum: int) -> int | None:
    return None if value is None else _setting_int(value, what, range(1, maximum + 1))


def rate_limit(value: Any, what: str) -> list[float] | None:
    """At most ``starts`` job starts per ``seconds``, given as ``(starts, seconds)``;
    None lifts the limit. Sent as one float array: [starts, seconds]."""
    if value is None:
        return None
    if isinstance(value, str | bytes) or not isinstance(value, tuple | list) or len(value) != 2:
        raise InvalidArgument(f"{what} must be (starts, seconds) or None, got {value!r}")
    starts = _setting_int(value[0], f"{what}'s starts", range(1, MAX_RATE + 1))
    period = seconds(value[1], f"{what}'s seconds", MAX_RATE_PERIOD, allow_zero=False)
    if period < MIN_RATE_PERIOD:
        raise InvalidArgument(
            f"{what}'s seconds must be at least {MIN_RATE_PERIOD:g} (the claim's clock "
            f"counts microseconds), got {period:g}"
        )
    return [float(starts), period]


def _policy(value: Any) -> OrderingPolicy:
    try:
        return OrderingPolicy(value)
    except ValueError:
        raise InvalidArgument(
            f"ordering_policy must be 'block' or 'continue', got {value!r}"
        ) from None


def retention(value: Any, what: str) -> float | None:
    """Seconds a finished job is kept; None keeps it forever."""
    return None if value is None else seconds(value, what, MAX_RETENTION_SECONDS)


def _retention_mode(value: Any) -> RetentionMode:
    try:
        return RetentionMode(value)
    except ValueError:
        raise InvalidArgument(
            f"retention_mode must be 'delete' or 'archive', got {value!r}"
        ) from None


def finished_states(values: object) -> list[str]:
    """The states a prune applies to: None for all finished states."""
    if values is None:
        return [state.value for state in FINISHED_STATES]
    if isinstance(values, str):
        values = [values]
    if not isinstance(values, Iterable):
        raise InvalidArgument(f"states must be a list of finished states, got {values!r}")
    chosen = []
    for value in list(values):
        try:
            state = JobStatus(value)
        except ValueError:
            state = None
        if state is None or not state.finished:
            raise InvalidArgument(
                f"states must be done, cancelled or failed (finished states), got {value!r}"
            )
        chosen.append(state)
    if not chosen:
        raise InvalidArgument("states must name at least one finished state")
    return [state.value for state in FINISHED_STATES if state in chosen]


def prune_batch(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_PRUNE_BATCH:
        raise InvalidArgument(f"batch must be an integer in [1, {MAX_PRUNE_BATCH}], got {value!r}")
    return int(value)


def _flag(value: Any, what: str) -> bool:
    if not isinstance(value, bool):
        raise InvalidArgument(f"{what} must be true or false, got {value!r}")
    return value


def queue_settings(settings: Mapping[str, Any]) -> dict[str, Any]:
    """SQL parameters for configure_queue: each setting, and whether it was given."""
    unknown = set(settings) - set(_SETTINGS)
    if unknown:
        raise InvalidArgument(f"unknown queue settings: {', '.join(sorted(unknown))}")
    params: dict[str, Any] = {}
    for keyword, (param, check) in _SETTINGS.items():
        given = settings.get(keyword, _UNSET)
        params[f"set_{param}"] = given is not _UNSET
        params[param] = None if given is _UNSET else check(given)
    base, cap = params["backoff_base"], params["backoff_cap"]
    if base is not None and cap is not None and cap < base:
        raise InvalidArgument("backoff_cap must be >= backoff_base")
    return params
