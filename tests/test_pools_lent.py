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

from .clients import Client


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


# -- a connection given back with session state ------------------------------------------


@pytest.mark.timeout(60)
def test_what_a_connection_user_sets_in_its_session_stays_with_that_user(
    client_class: type[Client], database_url: str, schema: str
) -> None:
    """README: `connection()` is "a connection of the queue's pool ... for your own
    SQL". What that SQL set for its session (a `SET`, a `LISTEN`, a session
    advisory lock) must not reach leaseq's next statements on that pooled
    connection, nor the next caller of `connection()`: a
    `SET statement_timeout = '1ms'` failed the next enqueue with
    StatementTimeout, a `SET default_transaction_read_only` made leaseq take
    the database for a standby, a `SET search_path` sent the next caller's
    unqualified SQL elsewhere."""
    with client_class(database_url, schema=schema, pool_size=1, statement_timeout=30) as queue:
        queue.migrate()
        for _ in range(6):  # leaseq's own statements prepared on the connection
            queue.enqueue("reports", {"n": 1})
        with queue.connection() as conn:
            conn.execute("SET statement_timeout = '1ms'")
            conn.execute("SET default_transaction_read_only = on")
            conn.execute("SET search_path = nowhere")
            conn.execute("LISTEN someone_elses_channel")
            conn.execute("SELECT pg_advisory_lock(4242)")
            pid = conn.execute("SELECT pg_backend_pid()").fetchone()
        for n in range(8):
            queue.enqueue("reports", {"n": n, "pad": "x" * 50_000})
            with queue.connection() as conn:  # the reset, again and again
                conn.execute("SELECT 1")
        with queue.connection() as conn:
            assert conn.execute("SELECT pg_backend_pid()").fetchone() == pid  # the same session
            # (the client's own settings, sent at connect, hold again)
            assert conn.execute("SHOW statement_timeout").fetchone() == ("30s",)
            assert conn.execute("SHOW default_transaction_read_only").fetchone() == ("off",)
            assert conn.execute("SHOW search_path").fetchone() != ("nowhere",)
            assert conn.execute("SELECT count(*) FROM pg_listening_channels()").fetchone() == (0,)
            assert conn.execute(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'"
                " AND pid = pg_backend_pid()"
            ).fetchone() == (0,)
