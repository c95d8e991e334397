"""What the clients' pools lend: a connection as the pool made it (autocommit,
writable), whatever its last user set, and none the server ended while it sat
idle."""

from __future__ import annotations

import time
import uuid

import psycopg
import pytest
from psycopg.conninfo import make_conninfo

import leaseq


def _named(database_url: str) -> tuple[str, str]:
    """``database_url`` under an application_name of its own, to find its sessions."""
    name = f"rc_{uuid.uuid4().hex[:12]}"
    return make_conninfo(database_url, application_name=name), name


def _terminate(database_url: str, name: str) -> int:
    """End every session of ``name`` (a killed backend, as a server restart does)."""
    with psycopg.connect(database_url, autocommit=True) as admin:
        killed = admin.execute(
            "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid))"
            " FROM pg_stat_activity WHERE application_name = %s",
            (name,),
        ).fetchone()
    time.sleep(0.3)  # the sessions' ends reach the client
    assert killed is not None
    return int(killed[0])


# -- a connection given back changed ---------------------------------------------------


@pytest.mark.timeout(60)
def test_a_pool_connection_is_autocommit_and_writable_whatever_its_last_user_set(
    database_url: str, schema: str
) -> None:
    """README: `connection()` is "a connection of the queue's pool (autocommit)".
    A caller that turned autocommit off, or made its transactions read-only, gave
    the connection back so: the next caller got a connection in a transaction
    (VACUUM fails there) and read-only transactions, which leaseq then took for a
    read-only database (DatabaseUnavailable) and dropped the pool for."""
    with leaseq.Queue(database_url, schema=schema, pool_size=1) as queue:
        queue.migrate()
        with queue.connection() as conn:
            conn.autocommit = False
            conn.read_only = True
            conn.isolation_level = psycopg.IsolationLevel.SERIALIZABLE
            conn.execute("SELECT 1")
        with queue.connection() as conn:
            assert conn.autocommit is True
            assert conn.read_only is None
            assert conn.isolation_level is None
        with queue.connection() as conn:
            conn.read_only = True
        with queue.connection() as conn, conn.transaction():
            conn.execute("CREATE TEMPORARY TABLE rc_written (x int)")


@pytest.mark.timeout(60)
async def test_an_async_pool_connection_is_autocommit_and_writable_whatever_its_last_user_set(
    database_url: str, schema: str
) -> None:
    async with leaseq.AsyncQueue(database_url, schema=schema, pool_size=1) as queue:
        await queue.migrate()
        async with queue.connection() as conn:
            await conn.set_autocommit(False)
            await conn.set_read_only(True)
            await conn.execute("SELECT 1")
        async with queue.connection() as conn:
            assert conn.autocommit is True
            assert conn.read_only is None
            await conn.set_read_only(True)
        async with queue.connection() as conn, conn.transaction():
            await conn.execute("CREATE TEMPORARY TABLE rc_written (x int)")


# -- idle connections the server ended ---------------------------------------------------


@pytest.mark.timeout(60)
def test_the_next_call_after_the_servers_end_of_idle_sessions_works(
    database_url: str, schema: str
) -> None:
    """The database is up; only the pool's idle sessions were ended (a
    pg_terminate_backend, a restart long ago). Each idle connection failed its
    next caller with TransientError ("terminating connection due to administrator
    command"): a web app's enqueues failed after every database restart, one per
    pooled connection, although nothing was wrong any more."""
    dsn, name = _named(database_url)
    with leaseq.Queue(dsn, schema=schema, pool_size=4) as queue:
        queue.migrate()
        # four connections lent at once: four idle connections in the pool after
        with queue.connection(), queue.connection(), queue.connection(), queue.connection():
            pass
        assert _terminate(database_url, name) >= 4
        for n in range(6):
            assert queue.enqueue("reports", {"n": n}) > 0


@pytest.mark.timeout(60)
async def test_the_next_async_call_after_the_servers_end_of_idle_sessions_works(
    database_url: str, schema: str
) -> None:
    dsn, name = _named(database_url)
    async with leaseq.AsyncQueue(dsn, schema=schema, pool_size=3) as queue:
        await queue.migrate()
        async with queue.connection(), queue.connection(), queue.connection():
            pass
        assert _terminate(database_url, name) >= 3
        for n in range(5):
            assert await queue.enqueue("reports", {"n": n}) > 0
