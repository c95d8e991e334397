"""Shared fixtures: a real PostgreSQL for the whole session, a fresh schema per test.

The server is ``DATABASE_URL`` when set, else leaseq's embedded server under
``.leaseq/`` (started once per session, stopped by the last test process).

The contract tests are a conformance suite: they take ``client``, which runs each
of them once per leg, ``[sync]`` on ``leaseq.Queue`` and ``[async]`` on
``leaseq.AsyncQueue`` behind the blocking adapter of ``tests/clients.py``. ``queue``
and ``aqueue`` are the two clients by name, for tests that are about one of them
(the CLI, the demo, plans, the worker). A stress test marked ``heavy`` runs its
async leg only with ``--all-legs`` (``.ci/run``'s second pass). With
``--second-server`` (that pass again, on PostgreSQL 15) the tests whose outcome
cannot depend on the server are skipped: those that never reach the database,
those marked ``server_agnostic``, and the sync leg of the conformance tests (the
two legs send the server the same statements; the clients' own code, which
differs, ran in the first pass).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import make_conninfo

import leaseq
from leaseq.testing import aset_clock_offset

from . import clients
from .clients import CLIENT_CLASSES, CLIENT_KINDS, Client, ClientConnect, ClientConnection
from .schemas import MIGRATING_FIXTURES, Schemas, new_name

ROOT = Path(__file__).resolve().parent.parent

ALL_LEGS = "--all-legs"
SECOND_SERVER = "--second-server"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        ALL_LEGS,
        action="store_true",
        help="also run the async leg of tests marked heavy (.ci/run's second pass does)",
    )
    parser.addoption(
        SECOND_SERVER,
        action="store_true",
        help="the suite ran on another server already: skip the tests whose outcome "
        "does not depend on the server (.ci/run's second pass)",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        f"heavy: a stress test whose async client leg runs only with {ALL_LEGS}",
    )
    config.addinivalue_line(
        "markers",
        "server_agnostic: uses the database, but what it checks is the same on any "
        f"server (worker processes, signals): skipped with {SECOND_SERVER}",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # The slow tests first: pytest-xdist hands tests out in this order, and a
    # minute-long test started last would keep one process busy while the other idles.
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)
    if config.getoption(SECOND_SERVER):
        same_anywhere = pytest.mark.skip(
            reason=f"its outcome does not depend on the server: skipped with {SECOND_SERVER}"
        )
        one_leg = pytest.mark.skip(
            reason="the sync leg sends the server what the async leg sends: with "
            f"{SECOND_SERVER} only the async leg runs"
        )
        for item in items:
            if (
                "database_url" not in getattr(item, "fixturenames", ())
                or item.get_closest_marker("server_agnostic") is not None
            ):
                item.add_marker(same_anywhere)
            elif getattr(item, "callspec", None) is not None and (
                item.callspec.params.get("client_kind") == "sync"
            ):
                item.add_marker(one_leg)
    if config.getoption(ALL_LEGS):
        return
    skip = pytest.mark.skip(
        reason=f"async leg of a heavy test: runs with {ALL_LEGS} (.ci/run's second pass)"
    )
    for item in items:
        callspec = getattr(item, "callspec", None)
        if (
            callspec is not None
            and callspec.params.get("client_kind") == "async"
            and item.get_closest_marker("heavy") is not None
        ):
            item.add_marker(skip)


@pytest.fixture(scope="session")
def database_url() -> str:
    return leaseq.database_url(os.environ.get("DATABASE_URL"), base=ROOT, keep_running=False)


@pytest.fixture(scope="session")
def schemas(database_url: str) -> Iterator[Schemas]:
    made = Schemas(database_url)
    yield made
    made.close()


@pytest.fixture
def schema(schemas: Schemas, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh schema of the test's own, dropped after it; already migrated when
    the test asks for a migrated client (tests/schemas.py)."""
    ahead = schemas.migrated() if MIGRATING_FIXTURES & set(request.fixturenames) else None
    name = ahead or new_name()
    yield name
    schemas.drop(name)


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


# -- the conformance suite's legs -------------------------------------------------


@pytest.fixture(params=CLIENT_KINDS)
def client_kind(request: pytest.FixtureRequest) -> str:
    """The leg: "sync" or "async" (the ids ``pytest -v`` shows)."""
    kind: str = request.param
    return kind


@pytest.fixture
def client_class(client_kind: str) -> type[Client]:
    """The leg's client class, called as ``leaseq.Queue`` is (``dsn``, ``schema=``, ...)."""
    return CLIENT_CLASSES[client_kind]


@pytest.fixture
def client(client_class: type[Client], database_url: str, schema: str) -> Iterator[Client]:
    """The client under test on a fresh, migrated schema."""
    with client_class(database_url, schema=schema) as c:
        c.migrate()
        yield c


@pytest.fixture
def client_connect(client_kind: str, database_url: str) -> Iterator[ClientConnect]:
    """Open a caller's own connection of the leg's flavour, for ``conn=`` (closed
    after the test): ``psycopg.Connection``, or the adapter's blocking facade over a
    ``psycopg.AsyncConnection``. For raw SQL that only checks the database, ``connect``."""
    opened: list[ClientConnection] = []

    def open_connection(**kwargs: Any) -> ClientConnection:
        conn = clients.connect(client_kind, database_url, **kwargs)
        opened.append(conn)
        return conn

    yield open_connection
    for conn in opened:
        conn.close()


class Clock:
    """Moves a schema's database clock forward; offsets accumulate. Through the
    client's own helper: ``set_clock_offset``, or ``aset_clock_offset`` on the async leg."""

    def __init__(self, client: Client) -> None:
        self.queue = client
        self.offset = 0.0

    def advance(self, seconds: float) -> None:
        self.offset += seconds
        clients.set_clock_offset(self.queue, self.offset)


@pytest.fixture
def clock(request: pytest.FixtureRequest) -> Clock:
    """The schema's clock, moved by the test's ``client`` (else by ``queue``)."""
    name = "client" if "client" in request.fixturenames else "queue"
    client: Client = request.getfixturevalue(name)
    return Clock(client)


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


class SpareDatabase:
    """A database of the test's own on the session's server, which the test may
    create late, and close to connections (as a server that is down would be)."""

    def __init__(self, server_url: str) -> None:
        self.name = f"t_spare_{uuid.uuid4().hex[:12]}"
        self._server_url = server_url
        self.dsn = make_conninfo(server_url, dbname=self.name)

    def _run(self, statement: str) -> None:
        with psycopg.connect(self._server_url, autocommit=True) as conn:
            conn.execute(statement)

    def create(self) -> None:
        self._run(f'CREATE DATABASE "{self.name}"')

    def refuse_connections(self) -> None:
        """New connections are refused, and the open ones are ended."""
        self._run(f'ALTER DATABASE "{self.name}" ALLOW_CONNECTIONS false')
        self._run(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            f" WHERE datname = '{self.name}' AND pid <> pg_backend_pid()"
        )

    def accept_connections(self) -> None:
        self._run(f'ALTER DATABASE "{self.name}" ALLOW_CONNECTIONS true')

    def turn_read_only(self) -> None:
        """New sessions are read-only and the open ones are ended: what clients see
        when a failover leaves their URL on a standby (or an operator puts the
        database in read-only mode for a move)."""
        self._run(f'ALTER DATABASE "{self.name}" SET default_transaction_read_only = on')
        self._run(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            f" WHERE datname = '{self.name}' AND pid <> pg_backend_pid()"
        )

    def turn_writable(self) -> None:
        """New sessions may write again; the open ones (read-only) are left alone."""
        self._run(f'ALTER DATABASE "{self.name}" RESET default_transaction_read_only')

    def drop(self) -> None:
        self._run(f'DROP DATABASE IF EXISTS "{self.name}" WITH (FORCE)')


@pytest.fixture
def spare_database(database_url: str) -> Iterator[SpareDatabase]:
    """A :class:`SpareDatabase`, not created yet; dropped after the test."""
    spare = SpareDatabase(database_url)
    yield spare
    spare.drop()
