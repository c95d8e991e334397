"""Checks of caller input, run before anything is sent: bad input writes nothing."""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any, TypeVar

from ._errors import InvalidArgument, InvalidJob
from ._payload_masking import PayloadFree, without_payload
from ._redact import redact
from ._types import Claim, JobStatus

T = TypeVar("T")

QUEUE_NAME = re.compile(r"[A-Za-z0-9_.:-]{1,128}")
SCHEMA_NAME = re.compile(r"[a-z_][a-z0-9_]{0,62}")
MAX_KEY_BYTES = 255
#: Ten years: a delay beyond this is a bug (seconds passed as milliseconds...).
MAX_DELAY_SECONDS = 10 * 365 * 24 * 3600.0
MAX_LEASE_SECONDS = 24 * 3600.0
PRIORITY_RANGE = range(-32768, 32768)
SEQ_RANGE = range(-(2**63), 2**63)
MAX_CLAIM_LIMIT = 10_000
MAX_ERROR_CHARS = 2000
#: A century: a retention beyond this is a unit mistake; None keeps forever.
MAX_RETENTION_SECONDS = 100 * 365 * 24 * 3600.0
MAX_PRUNE_BATCH = 10_000
#: The finished states retention applies to, in the order reports list them.
FINISHED_STATES = (JobStatus.DONE, JobStatus.CANCELLED, JobStatus.FAILED)


def schema_name(name: str) -> str:
    if not isinstance(name, str) or not SCHEMA_NAME.fullmatch(name):
        raise InvalidArgument(
            f"schema name must be lowercase letters, digits and _ (max 63), got {name!r}"
        )
    # PostgreSQL's own: CREATE SCHEMA refuses pg_* (ReservedName, a driver error at
    # migrate()), and leaseq's tables have no place among the catalog's.
    if name.startswith("pg_") or name == "information_schema":
        raise InvalidArgument(
            f"schema name {name!r} is reserved by PostgreSQL (pg_*, information_schema)"
        )
    return name


#: How much of a refused value an error quotes.
SHOWN_CHARS = 80


def shown(value: object) -> str:
    """A refused argument as its error quotes it. A text or a number as written
    (secrets redacted: a DSN given as the queue by mistake), cut short; any other
    value by its type only: a payload passed in the wrong place (arguments
    swapped) put all of it, secret fields included, in the error's text, and
    from there in logs and error trackers."""
    if value is None or isinstance(value, str | int | float):
        text = redact(repr(value))
        return text if len(text) <= SHOWN_CHARS else text[: SHOWN_CHARS - 1] + "…"
    return f"a {type(value).__name__}"


def queue_name(name: object) -> str:
    if not isinstance(name, str) or not QUEUE_NAME.fullmatch(name):
        raise InvalidJob(
            f"queue name must be 1-128 characters of A-Z a-z 0-9 _ . : -, got {shown(name)}"
        )
    return name


def ordering(key: object, seq: object) -> tuple[str | None, int | None]:
    """The stored (key, seq): a key without seq orders by enqueue order."""
    if key is None:
        if seq is not None:
            raise InvalidJob("seq needs an ordering key")
        return None, None
    return text_key(key, "ordering key"), 0 if seq is None else integer(seq, "seq", SEQ_RANGE)


def text_key(value: object, what: str) -> str:
    if not isinstance(value, str) or not value:
        raise InvalidJob(f"{what} must be a non-empty string, got {shown(value)}")
    if "\x00" in value:
        raise InvalidJob(f"{what} must not contain NUL bytes")
    try:
        size = len(value.encode())
    except UnicodeEncodeError as exc:
        raise InvalidJob(f"{what} is not valid Unicode") from exc
    if size > MAX_KEY_BYTES:
        raise InvalidJob(f"{what} is {size} bytes; the limit is {MAX_KEY_BYTES}")
    return value


def integer(value: object, what: str, allowed: range) -> int:
    if not isinstance(value, int) or not within(value, allowed):
        raise InvalidJob(f"{what} must be an integer in [{allowed.start}, {allowed.stop - 1}]")
    return int(value)  # a plain int: psycopg dumps a subclass by rules of its own


def within(value: object, allowed: range) -> bool:
    """An int (not a bool) in ``allowed``, compared by its bounds. ``x in range`` is
    O(1) for an exact int only: for an int subclass (a JobId, an IntEnum) it walks
    the range, and ``seq=job_id`` froze the process for a 2**64-long range."""
    return (
        isinstance(value, int)
        and not isinstance(value, bool)
        and allowed.start <= value < allowed.stop
    )


def _number_of_seconds(value: object, what: str) -> float:
    """An int or float (not a bool, not text) as a float; ±inf for an int too large."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidArgument(f"{what} must be a number of seconds, got {shown(value)}")
    try:
        return float(value)
    except OverflowError:  # an int too large for a float: out of range all the same
        return math.inf if value > 0 else -math.inf


def seconds(value: object, what: str, maximum: float, *, allow_zero: bool = True) -> float:
    number = _number_of_seconds(value, what)
    low_ok = number >= 0 if allow_zero else number > 0
    if not math.isfinite(number) or not low_ok or number > maximum:
        bound = ">= 0" if allow_zero else "> 0"
        raise InvalidArgument(
            f"{what} must be {bound} and at most {maximum:g} seconds, got {shown(value)}"
        )
    return number


def signed_seconds(value: object, what: str, maximum: float) -> float:
    """Seconds either way (an offset): finite, at most ``maximum`` from 0."""
    number = _number_of_seconds(value, what)
    if not math.isfinite(number) or abs(number) > maximum:
        raise InvalidArgument(
            f"{what} must be between -{maximum:g} and {maximum:g} seconds, got {shown(value)}"
        )
    return number


def delay(value: object) -> float | None:
    if value is None:
        return None
    try:
        return seconds(value, "delay", MAX_DELAY_SECONDS)
    except InvalidArgument as exc:
        raise InvalidJob(str(exc)) from None


MAX_JOB_TIMEOUT_SECONDS = 7 * 86400.0


def job_timeout(value: object) -> float | None:
    """A job's own handler time limit (enqueue's ``timeout``)."""
    if value is None:
        return None
    try:
        return seconds(value, "timeout", MAX_JOB_TIMEOUT_SECONDS, allow_zero=False)
    except InvalidArgument as exc:
        raise InvalidJob(str(exc)) from None


def unique(key: object, window: object) -> tuple[str | None, float | None]:
    """A unique job's key, and how long a done job keeps holding it (``unique_for``)."""
    if key is None:
        if window is not None:
            raise InvalidJob("unique_for needs a unique_key")
        return None, None
    return text_key(key, "unique key"), unique_window(window)


def unique_window(window: object) -> float | None:
    """How long a done unique job keeps holding its key (``unique_for``)."""
    if window is None:
        return None
    try:
        return seconds(window, "unique_for", MAX_DELAY_SECONDS)
    except InvalidArgument as exc:
        raise InvalidJob(str(exc)) from None


def run_at(value: object) -> datetime | None:
    if value is None:
        return None
    # Aware means an offset, not just a tzinfo: one whose utcoffset() is None is naive.
    if not isinstance(value, datetime) or value.utcoffset() is None:
        raise InvalidJob("run_at must be a timezone-aware datetime")
    # As absurd as a delay past MAX_DELAY_SECONDS (datetime.max, a year typed
    # wrong), in the future or the past. This host's clock suffices to tell:
    # the database's time decides when the job runs, and any skew is far smaller.
    if abs((value - datetime.now(UTC)).total_seconds()) > MAX_DELAY_SECONDS:
        raise InvalidJob(
            f"run_at must be within {MAX_DELAY_SECONDS / (365 * 24 * 3600):.0f} years "
            f"of now, got {value.isoformat()}"
        )
    return value


def lease(value: object) -> float | None:
    if value is None:
        return None
    return lease_seconds(value)


#: The shortest lease. The database keeps times to the microsecond: a lease under
#: half of one was stored as none at all, so a claim's lease had ended before the
#: claim returned (the next claim took the job again at once) and a renewal
#: "renewed" it to an end already past.
MIN_LEASE_SECONDS = 0.001


def lease_seconds(value: object, what: str = "lease") -> float:
    """A lease's duration (a claim's, a renewal's, a queue's): at least a
    millisecond, at most a day."""
    number = seconds(value, what, MAX_LEASE_SECONDS, allow_zero=False)
    if number < MIN_LEASE_SECONDS:
        raise InvalidArgument(
            f"{what} must be at least {MIN_LEASE_SECONDS:g} seconds (the database keeps "
            f"times to the microsecond), got {value!r}"
        )
    return number


def claims(values: object, what: str = "claims") -> list[Claim]:
    """The claims a fenced batch write takes: a list (or tuple) of what ``claim``
    returned."""
    if isinstance(values, str | bytes | bytearray) or not isinstance(values, Sequence):
        raise InvalidArgument(f"{what} must be a list of claims, got {values!r}"[:200])
    for value in values:
        claim(value)
    return list(values)


def claim(value: object) -> Claim:
    if not isinstance(value, Claim):
        raise InvalidArgument(f"a claim must be what claim() returned, got {value!r}"[:200])
    return value


def per_claim(values: object, what: str) -> Sequence[Any]:
    if isinstance(values, str | bytes | bytearray) or not isinstance(values, Sequence):
        raise InvalidArgument(f"{what} must be a list with one entry per claim, got {values!r}")
    return values


def flag(value: object, what: str) -> bool:
    if not isinstance(value, bool):
        raise InvalidArgument(f"{what} must be True or False, got {value!r}")
    return value


def dsn(value: object, what: str) -> str | None:
    """A database URL or libpq conninfo string; None (or empty) for the configured one."""
    if value is not None and not isinstance(value, str):
        raise InvalidArgument(f"{what} must be a database URL (a string) or None, got {value!r}")
    return value


def port(value: object) -> int:
    """A TCP port to listen on (0: any free one)."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 65535:
        raise InvalidArgument(f"port must be an integer in [0, 65535], got {value!r}")
    return int(value)  # a plain int: psycopg dumps a subclass by its own rules


def positive_int(value: object, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidArgument(f"{what} must be a positive integer, got {value!r}")
    return int(value)  # a plain int: psycopg dumps a subclass by its own rules


def claim_limit(value: object, what: str = "limit") -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_CLAIM_LIMIT:
        raise InvalidArgument(f"{what} must be an integer in [1, {MAX_CLAIM_LIMIT}], got {value!r}")
    return int(value)  # a plain int: psycopg dumps a subclass by its own rules


def error_texts(errors: Sequence[object] | None, claims: Sequence[Claim]) -> list[str | None]:
    """Per claim, the stored text of its error, without that claim's payload values."""
    return [
        error_text(error, claim.payload)
        for error, claim in zip(aligned(errors, claims, "errors"), claims, strict=True)
    ]


def error_text(error: object, payload: object = None) -> str | None:
    """Short, sanitized text for the job's last_error and history; never raises.

    No value of the job's ``payload`` shows in it (contract 7): an error raised on
    a job's input often quotes it, secret fields and all. The error's type name is
    kept whole (a value that happens to be part of it hides nothing).

    A worker flushes the outcomes of many jobs in one statement: one error that
    cannot be rendered must still give a text, not fail the whole batch.
    """
    if error is None:
        return None
    name, message = _describe(error)
    if not isinstance(error, PayloadFree):
        message = without_payload(message, payload)
    return sanitize(f"{name}: {message}" if name and message else name or message)


def _describe(error: object) -> tuple[str, str]:
    """The error's type name (none for a text) and its message."""
    try:
        if isinstance(error, BaseException):
            return type(error).__name__, str(error)
        return "", str(error)
    except Exception:
        pass
    try:
        return "", repr(error)
    except Exception:
        return f"{type(error).__name__} (its text could not be rendered)", ""


def sanitize(text: str) -> str:
    """Text PostgreSQL stores as is (no NUL, valid UTF-8), without secrets, truncated."""
    text = text.replace("\x00", "").encode("utf-8", "replace").decode("utf-8")
    # Redacted whole, then truncated: a cut must not leave half a secret unmatched.
    text = redact(text)
    if len(text) > MAX_ERROR_CHARS:
        text = text[: MAX_ERROR_CHARS - 1] + "…"
    return text


def aligned(values: Sequence[T] | None, claims: Sequence[Any], what: str) -> list[T | None]:
    """Per-claim values of a batch: one each, or None for all."""
    if values is None:
        return [None] * len(claims)
    values = per_claim(values, what)
    if len(values) != len(claims):
        raise InvalidArgument(f"{what} must have one entry per claim")
    return list(values)


def is_unicode(text: str) -> bool:
    """Whether ``text`` encodes to UTF-8, as the database stores it (no lone surrogate)."""
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True
