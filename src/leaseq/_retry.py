"""Pure retry policies: backoff and error classification (no I/O, no clocks)."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum

from . import _validate as validate
from ._errors import InvalidArgument, InvalidResult


class Retry(Exception):
    """Raise from a handler to ask for another attempt (after ``delay`` seconds).

    The delay is checked here, where the handler asks, so a bad one raises
    InvalidArgument in the handler (a permanent error: the job fails with it recorded)
    instead of poisoning the worker's batched acknowledgement later.
    """

    def __init__(self, delay: float | None = None, reason: str = "retry requested") -> None:
        self.delay = (
            None if delay is None else validate.seconds(delay, "delay", validate.MAX_DELAY_SECONDS)
        )
        if not isinstance(reason, str):  # the job's last error: a text that says why
            raise InvalidArgument(f"reason must be a str, got {type(reason).__name__}")
        self.reason = reason
        super().__init__(reason)

    def __reduce__(self) -> tuple[type[Retry], tuple[float | None, str]]:
        # Exceptions unpickle by calling the class with self.args, (reason,) here.
        return type(self), (self.delay, self.reason)


class PermanentError(Exception):
    """Raise (or subclass) to fail the job now: retrying cannot help."""


@dataclass(frozen=True, slots=True)
class Backoff:
    """Bounded exponential backoff with full jitter: uniform in [0, min(cap, base * 2^(n-1))]."""

    base: float = 1.0
    cap: float = 3600.0

    def __post_init__(self) -> None:
        # Every delay it returns must be one a retry accepts.
        base = validate.seconds(self.base, "backoff base", validate.MAX_DELAY_SECONDS)
        cap = validate.seconds(self.cap, "backoff cap", validate.MAX_DELAY_SECONDS)
        if base > cap:
            raise InvalidArgument("backoff needs 0 <= base <= cap")

    @classmethod
    def of(cls, value: object) -> Backoff:
        """A task's ``backoff=``: a Backoff, or its (base, cap) as a pair."""
        if isinstance(value, Backoff):
            return value
        if isinstance(value, tuple | list) and len(value) == 2:
            return cls(*value)
        raise InvalidArgument(f"backoff must be a Backoff or a (base, cap) pair, got {value!r}")

    def ceiling(self, attempt: int) -> float:
        return min(self.cap, self.base * 2.0 ** min(max(attempt - 1, 0), 62))

    def delay(self, attempt: int, uniform: Callable[[], float] = random.random) -> float:
        return uniform() * self.ceiling(attempt)


class Verdict(Enum):
    RETRY = "retry"
    FAIL = "fail"


@dataclass(frozen=True, slots=True)
class ErrorPolicy:
    """Which exceptions are worth another attempt.

    ``fail_on`` (and PermanentError) fail the job at once. If ``retry_on`` is
    given, only those exceptions are retried and every other one fails; without
    it every other exception is transient.
    """

    retry_on: tuple[type[BaseException], ...] = field(default=())
    fail_on: tuple[type[BaseException], ...] = field(default=())

    @staticmethod
    def exceptions(value: object, what: str) -> tuple[type[BaseException], ...]:
        """A task's ``retry_on=``/``fail_on=``: an exception class or a tuple (or
        list) of them, checked where the task is declared: a bad one found only
        when a handler raised would leave its job with no outcome."""
        classes = tuple(value) if isinstance(value, tuple | list) else (value,)
        for one in classes:
            if not (isinstance(one, type) and issubclass(one, BaseException)):
                raise InvalidArgument(
                    f"{what} must be an exception class or a tuple of them, got {value!r}"
                )
        return classes

    def classify(self, error: BaseException) -> Verdict:
        if isinstance(error, (PermanentError, InvalidArgument, InvalidResult)):
            return Verdict.FAIL
        if _raised_as(error, self.fail_on):
            return Verdict.FAIL
        if self.retry_on and not _raised_as(error, self.retry_on):
            return Verdict.FAIL
        return Verdict.RETRY


#: How far down an error's causes a task's classes are looked for (a cycle ends too).
_CAUSES_LOOKED_AT = 8


def _raised_as(error: BaseException, classes: tuple[type[BaseException], ...]) -> bool:
    """Whether ``error``, or an error it was raised from, is one of ``classes``.

    leaseq's errors keep the driver's as their cause: the handler's own SQL on a
    connection of leaseq's (``job.transaction()``, ``job.connection()``) fails
    with ``DatabaseError`` from ``psycopg.errors.UniqueViolation``, which is what
    a task's ``fail_on`` names. (Explicit causes only: an error raised while
    another was being handled is not that error.)"""
    cause: BaseException | None = error
    for _ in range(_CAUSES_LOOKED_AT):
        if cause is None:
            return False
        if isinstance(cause, classes):
            return True
        cause = cause.__cause__
    return False
