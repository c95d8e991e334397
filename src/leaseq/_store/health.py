"""Operations about the schema's health: its tables, what holds back cleanup, the
claim's live plan, and the leader's vacuum of the job table."""

from __future__ import annotations

from typing import Any

from .. import _health as health
from .. import _validate as validate
from .._health import TableCare, table_care
from .._health_types import ClaimPlan, CleanupHolder, Health, IndexHealth, TableHealth
from .._statement import Operation, Rows, Statement
from .base import StoreBase, ignore


class HealthOperations(StoreBase):
    """What `leaseq health`, `leaseq explain` and the maintenance leader run."""

    def health(
        self, *, long_transaction: float = health.LONG_TRANSACTION_SECONDS
    ) -> Operation[Health]:
        params = {"schema_name": self.schema}
        long_transaction = validate.seconds(
            long_transaction, "long_transaction", 10 * 365 * 86400, allow_zero=True
        )
        schema = self.schema

        def decode(rows: list[Rows]) -> Health:
            ((autovacuum, track_counts, idle_timeout, _version, sees_all, role, may_vacuum),) = (
                rows[0]
            )
            tables = tuple(TableHealth(*row) for row in rows[1])
            indexes = tuple(IndexHealth(*row) for row in rows[2])
            holders = tuple(CleanupHolder(*row) for row in rows[3])
            job = next((t for t in tables if t.name == "job"), None)
            # A leader of this role leaves the table to its owner (vacuum_check()).
            leader_vacuums = (
                job is not None
                and bool(may_vacuum)
                and not (autovacuum and track_counts and job.autovacuum_enabled)
            )
            return Health(
                tables=tables,
                indexes=indexes,
                holders=holders,
                server_autovacuum=bool(autovacuum and track_counts),
                idle_in_transaction_timeout=str(idle_timeout),
                leader_vacuums=leader_vacuums,
                sees_all_sessions=bool(sees_all),
                warnings=health.warnings(
                    tables,
                    holders,
                    schema=schema,
                    server_autovacuum=bool(autovacuum),
                    track_counts=bool(track_counts),
                    idle_in_transaction_timeout=str(idle_timeout),
                    long_transaction=long_transaction,
                    blind_role=None if sees_all else str(role),
                    not_owner=None if may_vacuum else str(role),
                ),
            )

        return Operation(
            (
                Statement(self.sql("health_settings.sql"), {"job_table": f"{self._quoted}.job"}),
                Statement(self.sql("health_tables.sql"), params),
                Statement(self.sql("health_indexes.sql"), params),
                Statement(self.sql("health_holders.sql")),
            ),
            decode,
        )

    def explain_claim(self, queue: str, *, limit: int = 10) -> Operation[ClaimPlan]:
        """The plan the server would pick now for a claim of ``queue`` (not run)."""
        params: dict[str, Any] = {
            "queue": validate.queue_name(queue),
            "limit": validate.claim_limit(limit),
            "lease": None,
        }
        schema = self.schema

        def decode(rows: list[Rows]) -> ClaimPlan:
            text = "\n".join(str(row[0]) for row in rows[0])
            coordinated = any(bool(row[0]) for row in rows[1])
            return ClaimPlan(
                queue=queue,
                plan=text,
                reads_ready_index=health.READY_INDEX in text and not coordinated,
                warnings=health.claim_plan_warnings(
                    text, queue=queue, schema=schema, coordinated=coordinated
                ),
                coordinated=coordinated,
            )

        explain = self.sql("explain.sql") + self.sql("claim.sql")
        return Operation(
            (
                Statement(explain, params),
                Statement(self.sql("claim_coordinated.sql"), {"queue": params["queue"]}),
            ),
            decode,
        )

    def vacuum_check(self) -> Operation[TableCare]:
        """What the job table needs from the maintenance leader now."""

        def decode(rows: list[Rows]) -> TableCare:
            if not rows[0]:
                return TableCare.NONE
            ((off, counted, dead, modified, estimated, may),) = rows[0]
            care = table_care(bool(off), bool(counted), int(dead), int(modified), int(estimated))
            return TableCare.NOT_OURS if care is not TableCare.NONE and not may else care

        params = {"job_table": f"{self._quoted}.job"}
        return Operation((Statement(self.sql("vacuum_check.sql"), params),), decode)

    def vacuum_job(self) -> Operation[None]:
        return Operation((Statement(self.sql("vacuum_job.sql")),), ignore)

    def analyze_job(self) -> Operation[None]:
        return Operation((Statement(self.sql("analyze_job.sql")),), ignore)

    def vacuum_lock_timeout(self, seconds: float | None) -> Operation[None]:
        """How long the session's next VACUUM or ANALYZE may wait for the table's
        lock (None: as the connection set it)."""
        if seconds is None:
            return Operation((Statement(self.sql("vacuum_lock_timeout_reset.sql")),), ignore)
        # Whole milliseconds, at least one: the server takes 0 as no timeout at all.
        params = {"lock_timeout": f"{max(1, round(seconds * 1000))}ms"}
        return Operation((Statement(self.sql("vacuum_lock_timeout.sql"), params),), ignore)
