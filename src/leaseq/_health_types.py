"""What ``health()`` and ``explain_claim()`` report: frozen dataclasses, no I/O."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime


@dataclass(frozen=True, slots=True)
class TableHealth:
    """One table of the schema: sizes in bytes, tuples (the server's statistics,
    a moment behind), the last (auto)vacuum and analyze."""

    name: str
    total_bytes: int
    table_bytes: int
    index_bytes: int
    estimated_rows: int
    live_tuples: int
    dead_tuples: int
    last_vacuum: datetime | None
    last_autovacuum: datetime | None
    last_analyze: datetime | None
    last_autoanalyze: datetime | None
    autovacuum_enabled: bool  # the table's own setting (the server's is on Health)


@dataclass(frozen=True, slots=True)
class IndexHealth:
    table: str
    name: str
    bytes: int
    scans: int


@dataclass(frozen=True, slots=True)
class CleanupHolder:
    """Something that keeps VACUUM from removing dead rows: a session's open
    snapshot or transaction, a replication slot, a prepared transaction."""

    kind: str  # "session" | "replication slot" | "prepared transaction"
    name: str  # "pid 123 (app)", the slot's or the prepared transaction's name
    state: str  # e.g. "idle in transaction", "active", "inactive"
    owner: str | None
    held_seconds: float | None  # how long its transaction has been open, when known
    xmin_age: int  # transactions since its snapshot: how far cleanup is held back


@dataclass(frozen=True, slots=True)
class Health:
    """What ``leaseq health`` reports: the schema's tables and indexes, what holds
    back cleanup, whether autovacuum runs, and warnings in plain language."""

    tables: tuple[TableHealth, ...]
    indexes: tuple[IndexHealth, ...]
    holders: tuple[CleanupHolder, ...]
    server_autovacuum: bool
    idle_in_transaction_timeout: str
    #: Autovacuum is off for the job table, and the role reading may vacuum it: a
    #: maintenance leader of this role vacuums it (one of another role leaves it be).
    leader_vacuums: bool
    warnings: tuple[str, ...]
    #: Whether this role sees other roles' transactions (superuser, or a member of
    #: pg_read_all_stats); if not, ``holders`` may miss what holds back cleanup.
    sees_all_sessions: bool = True
    #: The migrations this leaseq needs that the schema lacks (its workers refuse
    #: the schema until `leaseq migrate` ran; a warning says so): () when current.
    migrations_missing: tuple[int, ...] = ()

    def table(self, name: str) -> TableHealth | None:
        return next((t for t in self.tables if t.name == name), None)


@dataclass(frozen=True, slots=True)
class ClaimPlan:
    """The live plan of one queue's claim statement (EXPLAIN, not run)."""

    queue: str
    plan: str
    reads_ready_index: bool
    warnings: tuple[str, ...]
    #: The queue has limits or grouped jobs: claim_limited() picks its jobs, and
    #: ``plan`` (the plain branches) is not what runs for it.
    coordinated: bool = False
