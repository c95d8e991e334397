"""Waiting that a notification cuts short: what ``wait_result`` waits with.

Each is a context manager around a connection of its own (outside the pool: a
LISTEN must not leak into a pooled connection's next user) that yields
``wait(seconds)``: it returns when a notification arrives on the channel the
statement listens to, or when the seconds have passed. Without the connection
(it could not be opened, or broke) ``wait`` just sleeps: the caller polls
behind the notifications anyway, so losing them costs latency, never a result.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import psycopg

from .._statement import Statement


@contextlib.contextmanager
def notified(
    dsn: str, options: dict[str, Any], statement: Statement
) -> Iterator[Callable[[float], None]]:
    conn: psycopg.Connection[Any] | None = None
    with contextlib.suppress(psycopg.Error, OSError):
        conn = psycopg.Connection.connect(dsn, **{**options, "autocommit": True})
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

    async def listen() -> None:
        with contextlib.suppress(psycopg.Error, OSError):
            conn = await psycopg.AsyncConnection.connect(dsn, **{**options, "autocommit": True})
            async with conn:
                await conn.execute(statement.sql)
                woken.set()  # listening now: what finished before it, a look finds
                async for _ in conn.notifies():
                    woken.set()

    async def wait(seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                await woken.wait()
        woken.clear()

    listener = asyncio.create_task(listen())
    try:
        yield wait
    finally:
        listener.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await listener
