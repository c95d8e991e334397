"""Schema migrations: numbered ``sql/migrations/*.sql`` files, applied in order.

The plan is a generator (sans-I/O): it yields statements and receives their
rows, so the sync and the async client drive the same code. Everything runs in
one transaction under an advisory lock: concurrent ``migrate()`` calls queue up
and the later ones find nothing left to do.

A migration runs while the workers and producers go on (README "Upgrading"),
and some of its statements take a table's strongest lock (DROP TRIGGER on the
job table). A statement waiting for such a lock holds up every later statement
on the table, so each waits a short while at most (``lock_waits``): past it the
transaction rolls back, writing nothing, and the client tries again after a
pause, in which the queue goes on.
"""

from __future__ import annotations

import random
from collections.abc import Iterator

from ._errors import InvalidArgument, NotMigrated
from ._health import schema_behind
from ._statement import Plan, migration_files
from ._store import Store

#: The first attempt's lock wait, each next one's twice the last up to the
#: longest: how long a migration may hold up the queue's statements at a time.
FIRST_LOCK_WAIT_SECONDS = 0.5
LONGEST_LOCK_WAIT_SECONDS = 5.0
#: The pause after an attempt that gave up a lock wait (jittered down to half),
#: twice the last up to the longest: the queue goes on meanwhile.
FIRST_PAUSE_SECONDS = 1.0
LONGEST_PAUSE_SECONDS = 30.0


def lock_waits() -> Iterator[tuple[float, float]]:
    """Per attempt: how long its statements may wait for a lock, and the pause
    after it if one of them gave up. Endless: the migration runs once the
    transactions in its way have ended, as it did when it waited for them, but
    no statement of the queue waits behind it longer than a lock wait."""
    wait, pause = FIRST_LOCK_WAIT_SECONDS, FIRST_PAUSE_SECONDS
    while True:
        yield wait, pause * random.uniform(0.5, 1.0)
        wait = min(wait * 2, LONGEST_LOCK_WAIT_SECONDS)
        pause = min(pause * 2, LONGEST_PAUSE_SECONDS)


def plan(store: Store, lock_wait: float = LONGEST_LOCK_WAIT_SECONDS) -> Plan:
    """Yield the statements that bring ``store.schema`` up to date; return what was
    applied. InvalidArgument (nothing written: all of it is one transaction) when
    the schema's "migration" table is someone else's. Each statement after the
    migrators' lock waits ``lock_wait`` seconds at most for a lock (LockWaitOver,
    nothing written)."""
    yield store.migration_lock()
    yield store.migration_lock_timeout(lock_wait)
    yield store.migration_prepare()
    if (yield store.migration_check()) != [(True,)]:
        raise _foreign(store, "is not leaseq's (another table, or a view)")
    applied: dict[int, str] = {row[0]: row[1] for row in (yield store.applied_migrations())}
    files = migration_files()
    names = {version: name for version, name, _ in files}
    if any(names.get(version, name) != name for version, name in applied.items()):
        # leaseq's rows name its files: these are another tool's migrations.
        raise _foreign(store, "records migrations that are not leaseq's")
    done = []
    for version, name, text in files:
        if version in applied:
            continue
        yield store.migration(text)
        yield store.record_migration(version, name)
        done.append(version)
    return done


def latest_version() -> int:
    return max(version for version, _, _ in migration_files())


def require_current(schema: str, applied: set[int]) -> None:
    """NotMigrated unless ``schema`` has every migration this code ships: the code
    was deployed before `leaseq migrate` ran. A worker checks before its first
    claim; one that claimed on such a schema stopped at its first statement that
    needed the newer one, the jobs it held left running to their leases' end.
    Migrations this code does not know (a newer leaseq migrated first, as a
    rollout should) are no reason to refuse."""
    behind = schema_behind(schema, applied)
    if behind is not None:
        raise NotMigrated(behind)


def _foreign(store: Store, what: str) -> InvalidArgument:
    return InvalidArgument(
        f'cannot migrate: the table "migration" of schema {store.schema} {what}; '
        "give leaseq a schema of its own"
    )
