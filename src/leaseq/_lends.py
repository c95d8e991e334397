"""When a call first had a connection in hand: the earliest moment its statements
could reach the server.

The worker keeps each lease's deadline on its own monotonic clock, from a moment
no later than the one the database starts (or renews) the lease at. The moment
the call began is such a moment, but a call may first wait long for a
connection: with the database away, up to its client's open timeout (30 s).
Counted from then, a claim that waited out an outage longer than its lease came
back with leases already past their deadline: its jobs were lost as they
started, an attempt spent, and idle until the leases ended in the database. The
moment the connection was lent is still before the statement is sent, and after
the wait.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from contextvars import ContextVar


class FirstLend:
    """When the first connection of the calls made under :func:`noting_first_lend`
    was lent (monotonic), or None while none was."""

    __slots__ = ("at",)

    def __init__(self) -> None:
        self.at: float | None = None


_NOTED: ContextVar[FirstLend | None] = ContextVar("leaseq_first_lend", default=None)


@contextlib.contextmanager
def noting_first_lend() -> Iterator[FirstLend]:
    """Note when the calls made in this block (and in the tasks it creates: they
    copy the context) first get a connection of their pool."""
    noted = FirstLend()
    token = _NOTED.set(noted)
    try:
        yield noted
    finally:
        _NOTED.reset(token)


def note_lend() -> None:
    """A pool lent a connection (called by the database layer): noted if asked for."""
    noted = _NOTED.get()
    if noted is not None and noted.at is None:
        noted.at = time.monotonic()
