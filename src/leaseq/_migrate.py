"""Schema migrations: numbered ``sql/migrations/*.sql`` files, applied in order.

The plan is a generator (sans-I/O): it yields statements and receives their
rows, so the sync and the async client drive the same code. Everything runs in
one transaction under an advisory lock: concurrent ``migrate()`` calls queue up
and the later ones find nothing left to do.
"""

from __future__ import annotations

from ._statement import Plan, migration_files
from ._store import Store


def plan(store: Store) -> Plan:
    """Yield the statements that bring ``store.schema`` up to date; return what was applied."""
    yield store.migration_lock()
    yield store.migration_prepare()
    applied = {row[0] for row in (yield store.applied_migrations())}
    done = []
    for version, name, text in migration_files():
        if version in applied:
            continue
        yield store.migration(text)
        yield store.record_migration(version, name)
        done.append(version)
    return done


def latest_version() -> int:
    return max(version for version, _, _ in migration_files())
