"""What the clients' pools are made with, and the rules for giving one up: a
failed open is shared by the callers that waited for it; a pool whose connection
attempts fail is replaced rather than waited for (see :class:`~._db.Database`)."""

from __future__ import annotations

import time
from typing import Any

from psycopg_pool import AsyncConnectionPool, ConnectionPool

from .._errors import DatabaseUnavailable
from .options import CONNECTION_OPTIONS


def pool_settings(
    dsn: str, min_size: int, max_size: int, options: dict[str, Any] | None
) -> dict[str, Any]:
    return {
        "conninfo": dsn,
        "kwargs": options or CONNECTION_OPTIONS,
        "min_size": min_size,
        "max_size": max_size,
        "open": False,
        "name": "leaseq",
    }


class OpenFailures:
    """The failed openings of a client's pool. Callers that waited for the lock
    while an opening failed share its failure, rather than each waiting out an
    open timeout of its own in turn (with the database away, the tenth request of
    a web server would have waited ten timeouts)."""

    def __init__(self) -> None:
        self.count = 0
        self._last = DatabaseUnavailable("")

    def record(self, error: DatabaseUnavailable) -> DatabaseUnavailable:
        self.count += 1
        self._last = error
        return error

    def raise_if_since(self, seen: int) -> None:
        """Raise the last failure if one came after the caller read ``count``: a
        new error of its kind (an InvalidDatabaseURL stays one), not the same
        object, whose traceback would grow with every caller that raised it."""
        if self.count != seen:
            raise type(self._last)(str(self._last))


#: How long a caller waits for a pool that none of its connections is lent
#: from, before it looks whether the pool's connection attempts fail; if they do,
#: a new pool is tried. psycopg's pool retries a failed connection after 1, 2,
#: 4, 8 ... seconds: after a long outage its next try could come minutes after
#: the database is back, while a new pool tries at once.
POOL_ATTEMPT_SECONDS = 5.0


def attempt_timeout(deadline: float, wait_all: bool) -> float:
    """How long to wait for a pool: the rest of the caller's time, or one attempt's."""
    remaining = max(deadline - time.monotonic(), 0.0)
    return remaining if wait_all else min(POOL_ATTEMPT_SECONDS, remaining)


def failing(pool: ConnectionPool | AsyncConnectionPool) -> bool:
    """Whether the pool's connection attempts failed (so it retries with a growing
    delay), rather than one being slow to succeed."""
    return bool(pool.get_stats().get("connections_errors", 0))
