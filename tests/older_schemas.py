"""Schemas as an older leaseq left them: its migrations up to a version only."""

from __future__ import annotations

import psycopg

from leaseq._db.execution import drive
from leaseq._statement import Plan, migration_files
from leaseq._store import Store


def _migrated_until(store: Store, last: int) -> Plan:
    yield store.migration_prepare()
    for version, name, text in migration_files():
        if version > last:
            break
        yield store.migration(text)
        yield store.record_migration(version, name)
    return []


def migrate_until(database_url: str, schema: str, last: int) -> None:
    """Make ``schema`` with leaseq's migrations up to ``last`` only: the schema
    an older leaseq made (and recorded as such)."""
    with psycopg.connect(database_url, autocommit=True) as conn, conn.transaction():
        drive(conn, _migrated_until(Store(schema), last))
