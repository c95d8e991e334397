"""Migrations: idempotent, concurrent-safe, and producing exactly the golden schema."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import psycopg
import pytest

import leaseq
from leaseq import _migrate as migrate

from .clients import Client

GOLDEN = Path(leaseq.__file__).parent / "sql" / "migrations" / "golden_schema.txt"


def test_schema_equals_the_golden_dump(queue: leaseq.Queue) -> None:
    """Regenerate with LEASEQ_UPDATE_GOLDEN=1 after adding a migration, and review the diff."""
    lines = queue._db.run(queue._store.schema_catalog())
    text = "\n".join(lines) + "\n"
    if os.environ.get("LEASEQ_UPDATE_GOLDEN") == "1":
        GOLDEN.write_text(text)
    assert text == GOLDEN.read_text()


def test_migrate_is_idempotent(queue: leaseq.Queue) -> None:
    assert queue.migrate() == []
    with queue.connection() as conn:
        versions = conn.execute(f'SELECT version FROM "{queue.schema}".migration').fetchall()
    assert [v for (v,) in versions] == list(range(1, migrate.latest_version() + 1))


def test_concurrent_migrations_apply_once(database_url: str, schema: str) -> None:
    results: list[list[int]] = []
    errors: list[BaseException] = []
    barrier = threading.Barrier(6)

    def run() -> None:
        try:
            with leaseq.Queue(database_url, schema=schema) as queue:
                barrier.wait(timeout=30)
                results.append(queue.migrate())
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not errors, errors
    assert sorted(results, key=len) == [[]] * 5 + [list(range(1, migrate.latest_version() + 1))]


def test_two_schemas_are_independent(database_url: str, schema: str) -> None:
    other = schema + "_b"
    try:
        with (
            leaseq.Queue(database_url, schema=schema) as a,
            leaseq.Queue(database_url, schema=other) as b,
        ):
            a.migrate()
            b.migrate()
            a.enqueue("reports", {"from": "a"})
            assert b.claim("reports") == []
            assert [c.payload for c in a.claim("reports")] == [{"from": "a"}]
    finally:
        with psycopg.connect(database_url, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{other}" CASCADE')


def test_migrations_are_numbered_without_gaps() -> None:
    from leaseq._statement import migration_files

    versions = [version for version, _, _ in migration_files()]
    assert versions == list(range(1, len(versions) + 1))


def test_a_migration_cut_short_by_a_statement_timeout_writes_nothing(
    database_url: str, schema: str
) -> None:
    """A client's statement_timeout bounds migrate() too (the README says so): a
    migration that waits past it (here for another migrator's lock, as on a busy
    server) fails as StatementTimeout, leaves no trace, and a client without the
    timeout then applies every migration."""
    with psycopg.connect(database_url) as other_migrator:  # holds the lock until rollback
        # Should migrate() wait on regardless, the server ends this session (and the
        # lock) after 10 s, so that the test fails instead of hanging.
        other_migrator.execute("SET idle_in_transaction_session_timeout = '10s'")
        with leaseq.Queue(database_url, schema=schema) as client:
            lock = client._store.migration_lock()  # the lock migrate() takes first
        other_migrator.execute(lock.sql, lock.params)
        with (
            leaseq.Queue(database_url, schema=schema, statement_timeout=0.3) as hurried,
            pytest.raises(leaseq.StatementTimeout),
        ):
            hurried.migrate()
        other_migrator.rollback()
    with psycopg.connect(database_url, autocommit=True) as conn:
        found = conn.execute(
            "SELECT count(*) FROM pg_namespace WHERE nspname = %s", (schema,)
        ).fetchone()
    assert found == (0,)
    with leaseq.Queue(database_url, schema=schema) as patient:
        assert patient.migrate() == list(range(1, migrate.latest_version() + 1))


@pytest.mark.parametrize(
    "other",
    [
        "CREATE TABLE {schema}.job (x int)",
        "CREATE FUNCTION {schema}.clock() RETURNS timestamptz LANGUAGE sql AS 'SELECT now()'",
    ],
)
def test_a_schema_holding_objects_leaseq_did_not_make_is_one_clear_error(
    client_class: type[Client], database_url: str, schema: str, other: str
) -> None:
    """A table (or function) of someone else's named like one of leaseq's: a typed
    error saying so, not the driver's DuplicateTable; and nothing written."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
        conn.execute(other.format(schema=f'"{schema}"'))
    with (
        client_class(database_url, schema=schema) as client,
        pytest.raises(leaseq.InvalidArgument, match="holds objects leaseq's migrations did not"),
    ):
        client.migrate()
    with psycopg.connect(database_url, autocommit=True) as conn:
        tables = conn.execute(
            "SELECT count(*) FROM pg_tables WHERE schemaname = %s", (schema,)
        ).fetchone()
    assert tables == ((1,) if "TABLE" in other else (0,))


@pytest.mark.parametrize(
    "other",
    [
        # Another tool's migration table, of leaseq's own shape: "up to date",
        # having made nothing.
        "CREATE TABLE {schema}.migration (version integer PRIMARY KEY, name text NOT NULL,"
        " applied_at timestamptz NOT NULL DEFAULT now());"
        " INSERT INTO {schema}.migration (version, name)"
        " SELECT v, 'V' || v || '__their_change' FROM generate_series(1, 20) AS v",
        # A view over someone's table: leaseq's rows were written into it.
        "CREATE TABLE {schema}.theirs (version integer, name text, applied_at timestamptz);"
        " CREATE VIEW {schema}.migration AS SELECT * FROM {schema}.theirs",
        # Another shape: a DatabaseError whose hint said to run `leaseq migrate`.
        "CREATE TABLE {schema}.migration (id integer, filename text)",
    ],
    ids=["their migrations", "a view", "another shape"],
)
def test_a_migration_table_that_is_not_leaseqs_is_one_clear_error_and_nothing_is_written(
    queue: leaseq.Queue, database_url: str, schema: str, other: str
) -> None:
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA "{schema}" CASCADE')
        conn.execute(f'CREATE SCHEMA "{schema}"')
        conn.execute(other.format(schema=f'"{schema}"'))
        before = conn.execute(
            "SELECT count(*) FROM pg_class WHERE relnamespace = %s::regnamespace",
            (schema,),
        ).fetchone()
    with pytest.raises(leaseq.InvalidArgument, match='table "migration" of schema'):
        queue.migrate()
    with psycopg.connect(database_url, autocommit=True) as conn:
        after = conn.execute(
            "SELECT count(*) FROM pg_class WHERE relnamespace = %s::regnamespace",
            (schema,),
        ).fetchone()
        if "theirs" in other:
            written = conn.execute(f'SELECT count(*) FROM "{schema}".theirs').fetchone()
            assert written == (0,)
    assert after == before
