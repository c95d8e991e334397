"""Shared fixtures: a real PostgreSQL for the whole session, a fresh schema per test.

The server is ``DATABASE_URL`` when set, else leaseq's embedded server under
``.leaseq/`` (started once per session, stopped by the last test process).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import psycopg
import pytest

import leaseq
from leaseq.testing import aset_clock_offset, set_clock_offset

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def database_url() -> str:
    return leaseq.database_url(os.environ.get("DATABASE_URL"), base=ROOT, keep_running=False)


@pytest.fixture
def schema(database_url: str) -> Iterator[str]:
    name = f"t_{uuid.uuid4().hex[:16]}"
    yield name
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')


@pytest.fixture
def queue(database_url: str, schema: str) -> Iterator[leaseq.Queue]:
    with leaseq.Queue(database_url, schema=schema) as q:
        q.migrate()
        yield q


@pytest.fixture
async def aqueue(database_url: str, schema: str) -> AsyncIterator[leaseq.AsyncQueue]:
    async with leaseq.AsyncQueue(database_url, schema=schema) as q:
        await q.migrate()
        yield q


class Clock:
    """Moves a schema's database clock forward; offsets accumulate."""

    def __init__(self, queue: leaseq.Queue) -> None:
        self.queue = queue
        self.offset = 0.0

    def advance(self, seconds: float) -> None:
        self.offset += seconds
        set_clock_offset(self.queue, self.offset)


@pytest.fixture
def clock(queue: leaseq.Queue) -> Clock:
    return Clock(queue)


class AsyncClock:
    def __init__(self, queue: leaseq.AsyncQueue) -> None:
        self.queue = queue
        self.offset = 0.0

    async def advance(self, seconds: float) -> None:
        self.offset += seconds
        await aset_clock_offset(self.queue, self.offset)


@pytest.fixture
def aclock(aqueue: leaseq.AsyncQueue) -> AsyncClock:
    return AsyncClock(aqueue)


@pytest.fixture
def connect(database_url: str) -> Iterator[Callable[..., psycopg.Connection[tuple[object, ...]]]]:
    """Open extra raw connections (closed after the test)."""
    opened: list[psycopg.Connection[tuple[object, ...]]] = []

    def open_connection(**kwargs: object) -> psycopg.Connection[tuple[object, ...]]:
        conn = psycopg.connect(database_url, **kwargs)  # type: ignore[arg-type]
        opened.append(conn)
        return conn

    yield open_connection
    for conn in opened:
        conn.close()
