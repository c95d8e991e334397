"""The conformance suite's adapter: it has exactly Queue's interface, every call runs
the real AsyncQueue on the adapter's loop, and its connection facade behaves as the
tests' raw SQL and ``conn=`` transactions need."""

from __future__ import annotations

import asyncio
import inspect
import threading
from collections.abc import Callable
from typing import Any

import psycopg
import pytest

import leaseq

from .clients import (
    BlockingConnection,
    BlockingQueue,
    Client,
    public_methods,
    public_properties,
)
from .conftest import Clock


def test_the_adapter_has_exactly_the_public_interface_of_queue() -> None:
    """Same methods (parameters, docstrings) and properties as Queue, none written by
    hand: each wraps AsyncQueue's method of that name."""
    adapter, sync = public_methods(BlockingQueue), public_methods(leaseq.Queue)
    assert adapter.keys() == sync.keys()
    for name, method in adapter.items():
        assert method.__wrapped__ is getattr(leaseq.AsyncQueue, name), name  # type: ignore[attr-defined]
        assert inspect.signature(method).parameters.keys() == (
            inspect.signature(sync[name]).parameters.keys()
        ), name
        assert method.__doc__ == sync[name].__doc__, name
    assert public_properties(BlockingQueue).keys() == public_properties(leaseq.Queue).keys()


def test_the_adapter_shares_no_code_with_the_sync_client(database_url: str, schema: str) -> None:
    assert leaseq.Queue not in BlockingQueue.__mro__
    adapter = BlockingQueue(database_url, schema=schema)
    assert not isinstance(adapter, leaseq.Queue)
    assert isinstance(adapter.async_queue, leaseq.AsyncQueue)
    with pytest.raises(AttributeError):
        adapter._store  # noqa: B018 (internals are not forwarded)
    assert (adapter.schema, adapter.dsn) == (schema, adapter.async_queue.dsn)


def test_every_call_runs_the_async_method_on_the_adapters_loop(
    database_url: str, schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    adapter = BlockingQueue(database_url, schema=schema)
    seen: list[tuple[str, Any, Any]] = []
    facade = BlockingConnection.connect(database_url, autocommit=True)

    async def spy(*args: Any, **kwargs: Any) -> int:
        asyncio.get_running_loop()  # raises outside a coroutine on a running loop
        seen.append((threading.current_thread().name, args, kwargs))
        return 7

    monkeypatch.setattr(adapter.async_queue, "enqueue", spy)
    try:
        assert adapter.enqueue("reports", {"n": 1}, conn=facade, priority=2) == 7
    finally:
        facade.close()
    # The facade is unwrapped: the async client gets its own kind of connection.
    assert seen == [
        ("leaseq-test-loop", ("reports", {"n": 1}), {"conn": facade.raw, "priority": 2})
    ]


def test_errors_of_the_async_client_reach_the_caller_as_they_are(client: Client) -> None:
    with pytest.raises(leaseq.JobNotFound):
        client.get(999_999)


def test_the_facade_commits_rolls_back_and_fetches(
    client: Client, client_connect: Callable[..., Any]
) -> None:
    table = f'"{client.schema}".facade'
    with client.connection() as conn:
        conn.execute(f"CREATE TABLE {table} (n int)")
    own = client_connect()
    with own.transaction():
        own.execute(f"INSERT INTO {table} VALUES (1), (2)")
    with pytest.raises(ZeroDivisionError), own.transaction():
        own.execute(f"INSERT INTO {table} VALUES (3)")
        raise ZeroDivisionError
    with own.transaction(force_rollback=True) as tx:
        assert tx.force_rollback
        own.execute(f"INSERT INTO {table} VALUES (4)")
    with client.connection() as conn:
        assert conn.execute(f"SELECT n FROM {table} ORDER BY n").fetchall() == [(1,), (2,)]
        cursor = conn.execute(f"UPDATE {table} SET n = n + 10")
        assert cursor.rowcount == 2
        with pytest.raises(psycopg.ProgrammingError):
            cursor.fetchone()  # no rows to fetch, on either leg
    with client_connect() as closing:
        closing.execute(f"INSERT INTO {table} VALUES (5)")  # committed on exit
    assert closing.closed
    with client.connection() as conn:
        assert conn.execute(f"SELECT count(*) FROM {table}").fetchone() == (3,)


def test_the_clock_moves_the_schema_clock_through_either_client(
    client: Client, clock: Clock
) -> None:
    with client.connection() as conn:
        query = f'SELECT extract(epoch FROM "{client.schema}".clock() - now())'
        assert abs(float(conn.execute(query).fetchone()[0])) < 1
        clock.advance(90)
        clock.advance(30)
        assert 119 < float(conn.execute(query).fetchone()[0]) < 121
