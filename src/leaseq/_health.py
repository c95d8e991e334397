"""Reading the schema's health (no I/O): plain-language warnings, whether the
schema has every migration this code needs, and the rule by which the
maintenance leader vacuums the job table when autovacuum is off."""

from __future__ import annotations

import enum
from collections.abc import Sequence

from ._health_types import CleanupHolder, TableHealth
from ._statement import migration_files

#: The job table's own autovacuum settings (migration 0001): vacuum once its dead
#: rows pass 1000 + 1% of its rows. The leader applies the same rule by itself
#: when autovacuum is off.
VACUUM_THRESHOLD = 1000
VACUUM_SCALE_FACTOR = 0.01
#: A transaction open longer than this while it holds back cleanup gets a warning.
LONG_TRANSACTION_SECONDS = 60.0
#: The index the claim of ready jobs must read (migrations 0001 and 0002).
READY_INDEX = "job_ready_idx"


#: ... and analyze it once the rows changed since its last ANALYZE pass 50 + 2%
#: of its rows (the server's default threshold, the migration's scale factor).
ANALYZE_THRESHOLD = 50
ANALYZE_SCALE_FACTOR = 0.02


def migrations_missing(applied: set[int]) -> tuple[int, ...]:
    """The migrations this code ships that the schema lacks (those a newer leaseq
    applied, which this code does not know, are no lack)."""
    return tuple(version for version, _, _ in migration_files() if version not in applied)


def schema_behind(schema: str, applied: set[int]) -> str | None:
    """What to do when the schema misses migrations this code needs (None: it has
    them all): the code was deployed before `leaseq migrate` ran, and its workers
    refuse the schema until then."""
    if not migrations_missing(applied):
        return None
    latest = max(version for version, _, _ in migration_files())
    return (
        f"schema {schema} is at migration {max(applied, default=0)} and this leaseq "
        f"needs migration {latest}: run `leaseq migrate` (workers of the "
        "older leaseq work on the migrated schema meanwhile)"
    )


def vacuum_due(dead_tuples: int, rows: int) -> bool:
    return dead_tuples > VACUUM_THRESHOLD + VACUUM_SCALE_FACTOR * rows


class TableCare(enum.Enum):
    """What the maintenance leader does for the job table now (autovacuum off)."""

    NONE = "none"  # autovacuum runs, or nothing is due
    VACUUM = "vacuum"  # dead rows past the threshold: VACUUM (ANALYZE)
    #: Rows changed past the threshold without dead rows (a backlog being built:
    #: inserts): ANALYZE, or the planner and stats()' estimates never learn of it.
    ANALYZE = "analyze"
    UNCOUNTED = "uncounted"  # track_counts = off: nothing is counted, on a timer
    #: Something is due, but only the table's owner may vacuum or analyze it
    #: (the leader runs as a restricted role): said once, left to the owner.
    NOT_OURS = "not ours"


def table_care(
    autovacuum_off: bool, counted: bool, dead_tuples: int, modified: int, rows: int
) -> TableCare:
    """The leader's rule, autovacuum's own for this table."""
    if not autovacuum_off:
        return TableCare.NONE
    if not counted:
        return TableCare.UNCOUNTED
    if vacuum_due(dead_tuples, rows):
        return TableCare.VACUUM
    if modified > ANALYZE_THRESHOLD + ANALYZE_SCALE_FACTOR * rows:
        return TableCare.ANALYZE
    return TableCare.NONE


def duration(seconds: float) -> str:
    """``75.2`` -> ``"1m 15s"``: how people read how long something has been open."""
    whole = int(seconds)
    days, rest = divmod(whole, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    parts = [(days, "d"), (hours, "h"), (minutes, "m"), (secs, "s")]
    shown = [f"{value}{unit}" for value, unit in parts if value][:2]
    return " ".join(shown) or f"{seconds:.1f}s"


def warnings(
    tables: Sequence[TableHealth],
    holders: Sequence[CleanupHolder],
    *,
    schema: str,
    server_autovacuum: bool,
    track_counts: bool,
    idle_in_transaction_timeout: str,
    long_transaction: float = LONG_TRANSACTION_SECONDS,
    blind_role: str | None = None,
    not_owner: str | None = None,
) -> tuple[str, ...]:
    """The plain-language warnings; ``blind_role``: the role reading, when it cannot
    see other roles' transactions; ``not_owner``: the role reading, when it may not
    vacuum the job table (a maintenance leader of that role leaves it be)."""
    job = next((t for t in tables if t.name == "job"), None)
    if job is None:
        return (f"schema {schema!r} has no job table: run `leaseq migrate`",)
    said: list[str] = []
    autovacuum_off = not (server_autovacuum and track_counts and job.autovacuum_enabled)
    dead_matter = vacuum_due(job.dead_tuples, job.estimated_rows)
    if autovacuum_off:
        where = (
            "for the server (autovacuum = off)"
            if not server_autovacuum
            else "for the server (track_counts = off)"
            if not track_counts
            else f"for the table {schema}.job (autovacuum_enabled = false)"
        )
        if not_owner is None:
            care = (
                "The maintenance leader (in every worker, or `leaseq maintenance`) vacuums "
                f"the job table itself once its dead rows pass {VACUUM_THRESHOLD} + "
                f"{VACUUM_SCALE_FACTOR:.0%} of its rows, and analyzes it once "
                f"{ANALYZE_THRESHOLD} + {ANALYZE_SCALE_FACTOR:.0%} of its rows changed; "
                "turn autovacuum on where you can."
            )
        else:
            care = (
                f"Role {not_owner!r} may not vacuum or analyze {schema}.job (only its "
                "owner, the database's owner, or from PostgreSQL 17 a role granted "
                "MAINTAIN on it may): a maintenance leader running as this role leaves "
                "the table be. Turn autovacuum on, run the leader (`leaseq maintenance`) "
                "as the table's owner, or vacuum it yourself."
            )
        said.append(
            f"autovacuum is off {where}: PostgreSQL does not clean up the dead rows that "
            f"claims and completions leave. {care}"
        )
    if blind_role is not None:
        said.append(
            f"role {blind_role!r} cannot see the transactions of other roles' sessions "
            "(PostgreSQL shows them only to superusers and members of pg_read_all_stats): "
            "one that holds back the job table's cleanup is missing from this report and "
            f"from leaseq_cleanup_held_back_seconds; GRANT pg_read_all_stats TO {blind_role}."
        )
    for holder in holders:
        if holder.kind == "replication slot" or _long(holder, long_transaction):
            said.extend(_holder_warning(holder, job, dead_matter, idle_in_transaction_timeout))
    if dead_matter and not autovacuum_off and not any(_long(h, long_transaction) for h in holders):
        said.append(
            f"the job table has {job.dead_tuples:,} dead rows ({_share(job)} of its rows) "
            "and nothing holds back their cleanup: autovacuum is behind; give it more "
            "room (autovacuum_vacuum_cost_limit, autovacuum_max_workers) or vacuum now."
        )
    # A table never analyzed (nor vacuumed) has no row estimate (reltuples -1, read
    # as 0): its live rows, which every insert counts, say how large it is.
    rows = max(job.estimated_rows, job.live_tuples)
    if rows > 10_000 and not (job.last_analyze or job.last_autoanalyze):
        said.append(
            f"the job table was never analyzed: the planner guesses its contents; run "
            f"ANALYZE {schema}.job"
        )
    return tuple(said)


def _long(holder: CleanupHolder, limit: float) -> bool:
    return holder.held_seconds is not None and holder.held_seconds >= limit


def _share(table: TableHealth) -> str:
    total = table.live_tuples + table.dead_tuples
    return f"{table.dead_tuples / total:.0%}" if total else "all"


def _holder_warning(
    holder: CleanupHolder, job: TableHealth, dead_matter: bool, idle_timeout: str
) -> list[str]:
    if holder.kind == "replication slot":
        if not dead_matter:
            return []
        return [
            f"replication slot {holder.name!r} ({holder.state}) holds back cleanup by "
            f"{holder.xmin_age:,} transactions, so the job table's {job.dead_tuples:,} dead "
            "rows stay: if nothing consumes it, drop it (pg_drop_replication_slot)."
        ]
    assert holder.held_seconds is not None
    opened = f"{holder.kind} {holder.name} has had a transaction open for " + duration(
        holder.held_seconds
    )
    opened += f" ({holder.state}" + (f", user {holder.owner})" if holder.owner else ")")
    if dead_matter:
        effect = (
            f": PostgreSQL cannot remove row versions its snapshot may see, so the job "
            f"table's {job.dead_tuples:,} dead rows ({_share(job)}) stay and every claim "
            "steps over them. This is why the queue slows down."
        )
    else:
        effect = (
            ": while it stays open, PostgreSQL cannot remove the dead rows that claims "
            "and completions leave, and the queue slows down as they pile up."
        )
    if holder.kind == "prepared transaction":
        fix = " Finish it: COMMIT PREPARED or ROLLBACK PREPARED."
    else:
        pid = holder.name.split()[1]
        fix = f" End it (SELECT pg_terminate_backend({pid}))"
        if holder.state.startswith("idle in transaction") and idle_timeout in ("0", "0ms"):
            fix += ", and set idle_in_transaction_session_timeout (now off), e.g. '5min'."
        else:
            fix += "."
    return [opened + effect + fix]


def claim_plan_warnings(
    plan: str, *, queue: str, schema: str, coordinated: bool = False
) -> tuple[str, ...]:
    if coordinated:
        return (
            f"queue {queue!r} has limits or grouped jobs: its claim picks its jobs in "
            f"{schema}.claim_limited(), whose queries EXPLAIN does not show; the plan "
            "above is of the plain claim's branches, which do not run for this queue.",
        )
    if READY_INDEX in plan:
        return ()
    scan = " (it scans the whole job table)" if "Seq Scan on job" in plan else ""
    return (
        f"the claim of queue {queue!r} does not read {READY_INDEX}{scan}: every claim "
        f"walks rows it cannot take. Run ANALYZE {schema}.job; if the plan stays, check "
        "that the schema's indexes exist (`leaseq migrate`) and that no setting "
        "(enable_indexscan, random_page_cost) steers the planner away from them.",
    )
