"""What the clients' pools are made with, and the rules for giving one up: a
failed open is shared by the callers that waited for it; a pool whose connection
attempts fail is replaced rather than waited for; an attempt refused for good
ends the wait at once (:class:`ConnectWatch`); no attempt waits past the
caller's timeout (:func:`bounded_attempts`). See :class:`~.database.Database`."""

from __future__ import annotations

import asyncio
import logging
import math
import os
import threading
import time
from typing import Any, Self

import psycopg
from psycopg.conninfo import conninfo_to_dict
from psycopg.rows import tuple_row
from psycopg_pool import AsyncConnectionPool, ConnectionPool

from .._errors import DatabaseUnavailable, InvalidDatabaseURL
from .errors import refused_for_good, unavailable
from .options import CONNECTION_OPTIONS

#: The name of every pool leaseq makes (psycopg_pool's log lines carry it).
POOL_NAME = "leaseq"


def pool_settings(
    dsn: str, min_size: int, max_size: int, options: dict[str, Any] | None, open_timeout: float
) -> dict[str, Any]:
    return {
        "conninfo": dsn,
        "kwargs": bounded_attempts(dsn, options or CONNECTION_OPTIONS, open_timeout),
        "min_size": min_size,
        "max_size": max_size,
        "open": False,
        "name": POOL_NAME,
    }


class _OwnPoolsFailedAttempts(logging.Filter):
    """Drops psycopg_pool's line per failed connection attempt of leaseq's pools.

    While the database is away a pool whose attempts fail is replaced every
    POOL_ATTEMPT_SECONDS (below), and each new pool logged its own attempts: a
    worker's six pools wrote a hundred such lines a minute. What failed is told
    once where it matters: the caller's DatabaseUnavailable (with the attempt's
    error), the worker's one line per outage (_worker/outage.py). Other pools'
    lines, and psycopg_pool's other lines, pass."""

    def filter(self, record: logging.LogRecord) -> bool:
        # The rendered message: leaseq's redaction (_logs) may have rendered it already.
        return not record.getMessage().startswith(_FAILED_ATTEMPT)


_FAILED_ATTEMPT = f"error connecting in {POOL_NAME!r}: "


# On the logger psycopg_pool writes to, once (a module is imported once).
logging.getLogger("psycopg.pool").addFilter(_OwnPoolsFailedAttempts())


def bounded_attempts(dsn: str, options: dict[str, Any], open_timeout: float) -> dict[str, Any]:
    """``options`` with a ``connect_timeout`` of the caller's open timeout (libpq's
    least is 2 s), unless the URL or ``PGCONNECT_TIMEOUT`` sets one. libpq's own
    default is none: an attempt on a server that accepts and never answers hung
    for ever, in a pool given up long before."""
    try:
        given = conninfo_to_dict(dsn)
    except psycopg.Error:  # not parsable: refused before any attempt (malformed_dsn)
        return options
    if "connect_timeout" in options or given.get("connect_timeout"):
        return options
    if os.environ.get("PGCONNECT_TIMEOUT"):
        return options
    return {**options, "connect_timeout": max(2, math.ceil(open_timeout))}


def closed_by_server(conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any]) -> bool:
    """Whether an idle connection the pool lends was ended by the server while it
    waited in the pool (a killed backend, a server restarted since): read without
    blocking (the connections are non-blocking), so a live one costs no round
    trip. The server's last words (FATAL) come first, then the end of the stream:
    two reads. Handed out, such a connection failed its caller's next statement
    with TransientError although the database was up, once per idle connection."""
    try:
        for _ in range(2):
            conn.pgconn.consume_input()
    except psycopg.OperationalError:
        return True
    return conn.pgconn.status != psycopg.pq.ConnStatus.OK


def reset_state(conn: psycopg.Connection[Any], options: dict[str, Any]) -> None:
    """Give a lent connection the settings it was made with again (``options``:
    autocommit, its row factory) and no transaction characteristics of an earlier
    caller's, on the client side, no round trip. A caller that turned autocommit
    off or made its transactions read-only gave it back so: the next one got no
    autocommit connection, and read-only transactions that leaseq took for a
    read-only database. Each set only if changed: this runs at every lend."""
    autocommit = bool(options.get("autocommit", False))
    if conn.autocommit is not autocommit:
        conn.autocommit = autocommit
    if conn.read_only is not None:
        conn.read_only = None
    if conn.isolation_level is not None:
        conn.isolation_level = None
    if conn.deferrable is not None:
        conn.deferrable = None
    conn.row_factory = options.get("row_factory", tuple_row)


async def areset_state(conn: psycopg.AsyncConnection[Any], options: dict[str, Any]) -> None:
    """The async twin of :func:`reset_state`."""
    autocommit = bool(options.get("autocommit", False))
    if conn.autocommit is not autocommit:
        await conn.set_autocommit(autocommit)
    if conn.read_only is not None:
        await conn.set_read_only(None)
    if conn.isolation_level is not None:
        await conn.set_isolation_level(None)
    if conn.deferrable is not None:
        await conn.set_deferrable(None)
    conn.row_factory = options.get("row_factory", tuple_row)


def reset_session(conn: psycopg.Connection[Any], statement: str) -> None:
    """Undo, with ``statement``, what a caller's own SQL left in the session of a
    connection it gives back (a SET, a LISTEN, an advisory lock): it would reach
    leaseq's next statements on it and the next caller. A connection that cannot
    be reset (a transaction left open, a broken one) is closed: the pool makes
    another. Its failure is not the caller's: never raised."""
    if conn.closed:
        return
    if conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
        conn.close()
        return
    try:
        conn.execute(statement)
    except Exception:
        conn.close()
    except BaseException:  # interrupted midway: in no known state
        conn.close()
        raise


async def areset_session(conn: psycopg.AsyncConnection[Any], statement: str) -> None:
    """The async twin of :func:`reset_session`."""
    if conn.closed:
        return
    if conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
        await conn.close()
        return
    try:
        await conn.execute(statement)
    except Exception:
        await conn.close()
    except BaseException:  # cancelled midway: in no known state
        await conn.close()
        raise


#: The least time a pool is given to take in the connection its first attempt made.
READY_SECONDS = 1.0


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


class ConnectWatch:
    """What a new pool's connection attempts come to, for the caller that waits for
    it to open: the first connection made, or one refused for good
    (``refused_for_good``), ends the wait; the other failures are kept, to say why
    no connection came.

    Without it the caller waited on the pool itself: a refused password held it for
    its whole open timeout (30 s for a client by default) and a worker tried again
    for ever; and a pool that timed out was closed before the caller heard of it,
    joining an attempt that hung on a silent server for 5 s, after which one more
    connection (the diagnosis) took up to 5 s again: `connect_timeout=3` took 11 s.
    """

    def __init__(self) -> None:
        self.refusal: InvalidDatabaseURL | None = None
        #: The last attempt's failure (a refusal for good included).
        self.failure: psycopg.Error | None = None
        self._settled = threading.Event()  # set from the pool's worker threads
        self._asettled: asyncio.Event | None = None

    def connection_class(self) -> type[psycopg.Connection[Any]]:
        watch = self

        class Watched(psycopg.Connection[Any]):
            @classmethod
            def connect(cls, conninfo: str = "", **kwargs: Any) -> Self:
                try:
                    conn = super().connect(conninfo, **kwargs)
                except psycopg.Error as exc:
                    watch._failed(exc)
                    raise
                watch._settle()
                return conn

        return Watched

    def async_connection_class(self) -> type[psycopg.AsyncConnection[Any]]:
        watch = self
        self._asettled = asyncio.Event()

        class Watched(psycopg.AsyncConnection[Any]):
            @classmethod
            async def connect(cls, conninfo: str = "", **kwargs: Any) -> Self:
                try:
                    conn = await super().connect(conninfo, **kwargs)
                except psycopg.Error as exc:
                    watch._failed(exc)
                    raise
                watch._settle()
                return conn

        return Watched

    def wait(self, timeout: float) -> bool:
        """Whether an attempt connected or was refused for good within ``timeout``."""
        return self._settled.wait(timeout)

    async def await_(self, timeout: float) -> bool:
        """The async twin of :meth:`wait`."""
        assert self._asettled is not None, "made without async_connection_class()"
        try:
            await asyncio.wait_for(self._asettled.wait(), timeout)
        except TimeoutError:
            return False
        return True

    def unavailable(self, open_timeout: float) -> DatabaseUnavailable:
        """Why no connection came in ``open_timeout``: the last attempt's failure,
        else the attempt that was still waiting for the server."""
        if self.failure is not None:
            return unavailable(self.failure)
        return DatabaseUnavailable(
            f"cannot connect to the database: no connection within {open_timeout:g} s "
            "(the server did not answer)"
        )

    def _failed(self, exc: psycopg.Error) -> None:
        self.failure = exc
        if (refusal := refused_for_good(exc)) is not None:
            self.refusal = refusal
            self._settle()

    def _settle(self) -> None:
        self._settled.set()
        if self._asettled is not None:
            # An asyncio.Event is not thread-safe, but the async pool's attempts run
            # on the caller's loop.
            self._asettled.set()
