"""Waiting that a notification cuts short: what ``wait_result`` waits with.

Each is a context manager around a connection of its own (outside the pool: a
LISTEN must not leak into a pooled connection's next user; the shared listeners
give every waiter of a client the same one) that yields
``wait(seconds)``: it returns when a notification arrives on the channel the
statement listens to, or when the seconds have passed; it yields once the
LISTEN is in place, so what the caller does next cannot be missed. Without the connection
(it could not be opened, or broke) ``wait`` just sleeps: the caller polls
behind the notifications anyway, so losing them costs latency, never a result.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import psycopg

from .._statement import Statement
from .._waiting import raise_if_cancelling

#: How long ``anotified`` waits for its LISTEN before it yields all the same.
LISTEN_READY_SECONDS = 5.0
#: The sync twin's bound on its connection (libpq counts whole seconds).
LISTEN_CONNECT_SECONDS = 5


@contextlib.contextmanager
def notified(
    dsn: str, options: dict[str, Any], statement: Statement
) -> Iterator[Callable[[float], None]]:
    conn: psycopg.Connection[Any] | None = None
    with contextlib.suppress(psycopg.Error, OSError):
        # Bounded as the async twin's readiness wait: a server that accepts and
        # never answers must not hold wait_result past its timeout.
        conn = psycopg.Connection.connect(
            dsn, **{"connect_timeout": LISTEN_CONNECT_SECONDS, **options, "autocommit": True}
        )
        conn.execute(statement.sql)

    def wait(seconds: float) -> None:
        nonlocal conn
        if conn is not None and not conn.broken:
            started = time.monotonic()
            try:
                for _ in conn.notifies(timeout=seconds, stop_after=1):
                    pass
                return
            except (psycopg.Error, OSError):
                conn.close()
                conn = None
                seconds -= time.monotonic() - started
        time.sleep(max(seconds, 0.0))

    try:
        yield wait
    finally:
        if conn is not None:
            conn.close()


@contextlib.asynccontextmanager
async def anotified(
    dsn: str, options: dict[str, Any], statement: Statement
) -> AsyncIterator[Callable[[float], Awaitable[None]]]:
    woken = asyncio.Event()
    ready = asyncio.Event()  # listening, or given up

    async def listen() -> None:
        try:
            with contextlib.suppress(psycopg.Error, OSError):
                conn = await psycopg.AsyncConnection.connect(dsn, **{**options, "autocommit": True})
                async with conn:
                    await conn.execute(statement.sql)
                    ready.set()
                    async for _ in conn.notifies():
                        woken.set()
        finally:
            ready.set()

    async def wait(seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                await woken.wait()
        woken.clear()

    listener = asyncio.create_task(listen())
    try:
        # The caller acts once listening (a notification sent before would be
        # missed); a connection that takes too long leaves it to polling.
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(LISTEN_READY_SECONDS):
                await ready.wait()
        yield wait
    finally:
        listener.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await listener
        # A cancellation of the caller that arrived while the listener ended was
        # swallowed with the listener's own just above: it must still propagate.
        raise_if_cancelling()


class SharedListener:
    """One LISTEN connection for every waiter of a database, not one each: a few
    hundred concurrent ``wait_result`` calls would otherwise take as many server
    connections (past max_connections, locking workers out). Each waiter gets an
    event of its own, set by every notification; the connection opens with the
    first waiter and closes with the last (or when the event loop changes)."""

    def __init__(self, dsn: str, options: dict[str, Any], statement: Statement) -> None:
        self._dsn = dsn
        self._options = options
        self._statement = statement
        self._waiters: set[asyncio.Event] = set()
        self._task: asyncio.Task[None] | None = None
        self._ready = asyncio.Event()

    async def _listen(self, ready: asyncio.Event) -> None:
        try:
            with contextlib.suppress(psycopg.Error, OSError):
                conn = await psycopg.AsyncConnection.connect(
                    self._dsn, **{**self._options, "autocommit": True}
                )
                async with conn:
                    await conn.execute(self._statement.sql)
                    ready.set()
                    async for _ in conn.notifies():
                        for woken in self._waiters:
                            woken.set()
        finally:
            ready.set()

    @contextlib.asynccontextmanager
    async def waiting(self) -> AsyncIterator[Callable[[float], Awaitable[None]]]:
        """As :func:`anotified`, on the shared connection."""
        woken = asyncio.Event()
        task = self._task
        if task is not None and task.get_loop() is not asyncio.get_running_loop():
            # Another event loop's listener: this loop cannot await it.
            async with anotified(self._dsn, self._options, self._statement) as private:
                yield private
            return
        if task is None or task.done():
            # None yet, or its connection broke: a new one for this waiter on
            # (those already waiting poll until they next wait).
            self._ready = asyncio.Event()
            task = self._task = asyncio.create_task(self._listen(self._ready))
        self._waiters.add(woken)

        async def wait(seconds: float) -> None:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(seconds):
                    await woken.wait()
            woken.clear()

        try:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(LISTEN_READY_SECONDS):
                    await self._ready.wait()
            yield wait
        finally:
            self._waiters.discard(woken)
            if not self._waiters and self._task is task:
                self._task = None
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            # A cancellation of the caller swallowed with the listener's own just
            # above must still propagate.
            raise_if_cancelling()


class SharedThreadListener:
    """The sync twin of :class:`SharedListener`: one LISTEN connection, read by a
    thread of its own, for every thread of a client that waits; it opens with the
    first waiter and closes with the last."""

    #: How often the reading thread looks whether its last waiter left.
    STOP_SECONDS = 0.2

    def __init__(self, dsn: str, options: dict[str, Any], statement: Statement) -> None:
        self._dsn = dsn
        self._options = options
        self._statement = statement
        self._lock = threading.Lock()
        self._waiters: set[threading.Event] = set()
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._ready = threading.Event()

    def _listen(self, ready: threading.Event, stop: threading.Event) -> None:
        try:
            with contextlib.suppress(psycopg.Error, OSError):
                options = {"connect_timeout": LISTEN_CONNECT_SECONDS, **self._options}
                with psycopg.Connection.connect(
                    self._dsn, **{**options, "autocommit": True}
                ) as conn:
                    conn.execute(self._statement.sql)
                    ready.set()
                    while not stop.is_set():
                        for _ in conn.notifies(timeout=self.STOP_SECONDS, stop_after=1):
                            with self._lock:
                                for woken in self._waiters:
                                    woken.set()
        finally:
            ready.set()

    @contextlib.contextmanager
    def waiting(self) -> Iterator[Callable[[float], None]]:
        """As :func:`notified`, on the shared connection."""
        woken = threading.Event()
        with self._lock:
            thread = self._thread
            if thread is None or not thread.is_alive():
                # None yet, or its connection broke (or this is a forked child):
                # a new one (those already waiting poll until they next wait).
                self._ready, self._stop = threading.Event(), threading.Event()
                thread = self._thread = threading.Thread(
                    target=self._listen,
                    args=(self._ready, self._stop),
                    name="leaseq-results-listener",
                    daemon=True,
                )
                thread.start()
            self._waiters.add(woken)
            ready, stop = self._ready, self._stop

        def wait(seconds: float) -> None:
            woken.wait(max(seconds, 0.0))
            woken.clear()

        try:
            ready.wait(LISTEN_CONNECT_SECONDS)
            yield wait
        finally:
            with self._lock:
                self._waiters.discard(woken)
                if not self._waiters and self._thread is thread:
                    self._thread = None
                    stop.set()


@contextlib.contextmanager
def sleeping() -> Iterator[Callable[[float], None]]:
    """``wait(seconds)`` with no LISTEN: behind a transaction pooler a LISTEN stays
    on a server connection of the pool, whose next users (anyone's) get its
    notifications; the caller's polling is all there is then."""
    yield time.sleep


@contextlib.asynccontextmanager
async def asleeping() -> AsyncIterator[Callable[[float], Awaitable[None]]]:
    """The asyncio twin of :func:`sleeping`."""
    yield asyncio.sleep
