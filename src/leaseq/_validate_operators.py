"""Checks of the operators' input, run before anything is sent: job ids (and the
lease versions seen of them), who acts, schedule names, searches. Bad input writes
nothing."""

from __future__ import annotations

from collections.abc import Sequence

from ._errors import InvalidArgument
from ._types import JobStatus
from ._validate import MAX_CLAIM_LIMIT, is_unicode

MAX_ACTOR_CHARS = 200
MAX_SCHEDULE_NAME_BYTES = 128
MAX_SEARCH_WINDOW = 10_000_000


def job_id(value: object, what: str = "job id") -> int:
    """A job id, or another bigint id (``what`` names it in the error)."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value < 2**63:
        raise InvalidArgument(f"{what} must be a positive integer, got {value!r}")
    # A plain int: psycopg dumps a JobId (an int subclass) by rules of its own,
    # and a list of JobIds and ints as "mixed types" (DataError).
    return int(value)


def lease_version(value: object) -> int:
    """A job's lease_version as someone saw it: a bigint >= 0."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**63:
        raise InvalidArgument(f"a lease version must be an integer >= 0, got {value!r}")
    return int(value)


def lease_versions(values: object, job_ids: list[int]) -> list[int]:
    """The lease_version seen of each of ``job_ids`` (distinct then): one per id, each
    a bigint >= 0."""
    if isinstance(values, str | bytes) or not isinstance(values, Sequence):
        raise InvalidArgument(f"lease_versions must be a sequence of integers, got {values!r}")
    versions = list(values)
    if len(versions) != len(job_ids):
        raise InvalidArgument(
            f"lease_versions must hold one version per job id: {len(versions)} for "
            f"{len(job_ids)} ids"
        )
    checked = [lease_version(version) for version in versions]
    if len(set(job_ids)) != len(job_ids):
        raise InvalidArgument("with lease_versions, each job id may be given once")
    return checked


def schedule_name(value: object) -> str:
    """A periodic job's name: 1 to 128 bytes of text, no NUL."""
    if isinstance(value, str) and "\x00" not in value:
        try:
            if 0 < len(value.encode()) <= MAX_SCHEDULE_NAME_BYTES:
                return value
        except UnicodeEncodeError:  # a lone surrogate: not text the database stores
            pass
    raise InvalidArgument(
        f"a schedule name must be 1 to {MAX_SCHEDULE_NAME_BYTES} bytes of text, got {value!r}"
    )


def actor(value: object) -> str | None:
    """Who an operator action is recorded for (None: the database role)."""
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip() or "\x00" in value:
        raise InvalidArgument(f"actor must be a non-empty string, got {value!r}")
    if len(value) > MAX_ACTOR_CHARS:
        raise InvalidArgument(f"actor is {len(value)} characters; the limit is {MAX_ACTOR_CHARS}")
    if not is_unicode(value):
        raise InvalidArgument("actor is not valid Unicode (a lone surrogate)")
    return value


def job_ids(values: object) -> list[int]:
    if isinstance(values, str | bytes) or not isinstance(values, Sequence):
        raise InvalidArgument(f"job ids must be a sequence of integers, got {values!r}")
    ids = [job_id(v) for v in values]
    if len(ids) > MAX_CLAIM_LIMIT:
        raise InvalidArgument(f"at most {MAX_CLAIM_LIMIT} job ids per call, got {len(ids)}")
    return ids


def search_text(value: object, what: str) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value or "\x00" in value or len(value) > 1000:
        raise InvalidArgument(f"{what} must be a non-empty string of at most 1000 characters")
    if not is_unicode(value):
        raise InvalidArgument(f"{what} is not valid Unicode (a lone surrogate)")
    return value


def search_window(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_SEARCH_WINDOW:
        raise InvalidArgument(
            f"window must be an integer in [1, {MAX_SEARCH_WINDOW}], got {value!r}"
        )
    return int(value)


def job_status(value: object) -> JobStatus:
    if isinstance(value, str) and value in JobStatus._value2member_map_:
        return JobStatus(value)
    raise InvalidArgument(f"unknown job status {value!r}")
