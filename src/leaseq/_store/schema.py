"""Operations on the schema itself: LISTEN, the leaders' locks, migrations, the
golden catalog, and the test clock."""

from __future__ import annotations

from .. import _validate as validate
from .._statement import Operation, Statement
from .base import StoreBase, ignore

#: A century either way: the test clock's furthest move.
MAX_CLOCK_OFFSET_SECONDS = 100 * 365 * 86400.0


class SchemaOperations(StoreBase):
    """Statements about the schema rather than its jobs."""

    def listen(self) -> Statement:
        return Statement(self.sql("listen.sql").replace("{channel}", f'"{self.channel}"'))

    def listen_results(self) -> Statement:
        """Completions and failures name their queue on this channel (wait_result)."""
        return Statement(self.sql("listen.sql").replace("{channel}", f'"{self.results_channel}"'))

    def reset_session(self) -> Statement:
        """Undo what a caller's SQL left in a pooled connection's session."""
        return Statement(self.sql("reset_session.sql"))

    def maintenance_lock(self) -> Operation[bool]:
        """Take the schema's leader lock if free, on a session whose server end notices
        a vanished client within ~25 s (maintenance_keepalive.sql): True if taken."""
        params = {"schema_name": self.schema}
        return Operation(
            (
                Statement(self.sql("maintenance_keepalive.sql")),
                Statement(self.sql("maintenance_lock.sql"), params),
            ),
            lambda r: bool(r[1][0][0]),
        )

    def migration_lock(self) -> Statement:
        return Statement(self.sql("migrate/lock.sql"), {"schema_name": self.schema})

    def migration_lock_timeout(self, seconds: float) -> Statement:
        """Each later statement of the migration waits for a lock ``seconds`` at most."""
        return Statement(
            self.sql("migrate/lock_timeout.sql"), {"lock_timeout": f"{round(seconds * 1000)}ms"}
        )

    def migration_prepare(self) -> Statement:
        return Statement(self.sql("migrate/prepare.sql"))

    def migration_check(self) -> Statement:
        return Statement(
            self.sql("migrate/check.sql"), {"migration_table": f"{self._quoted}.migration"}
        )

    def applied_migrations(self) -> Statement:
        return Statement(self.sql("migrate/applied.sql"))

    def migrations_applied(self) -> Operation[set[int]]:
        """The versions of leaseq's migrations the schema has."""
        return Operation((self.applied_migrations(),), lambda r: {row[0] for row in r[0]})

    def migration(self, text: str) -> Statement:
        return Statement(self.render(text))

    def record_migration(self, version: int, name: str) -> Statement:
        return Statement(self.sql("migrate/record.sql"), {"version": version, "name": name})

    def schema_catalog(self) -> Operation[list[str]]:
        """A server-independent description of the schema (the golden dump's lines)."""
        quoted, plain = self._quoted + ".", self.schema + "."

        def normalise(text: str) -> str:
            return text.replace(quoted, "<schema>.").replace(plain, "<schema>.")

        return Operation(
            (Statement(self.sql("schema_catalog.sql"), {"schema_name": self.schema}),),
            lambda r: [f"{kind}: {normalise(text)}" for kind, text in r[0]],
        )

    def set_clock_offset(self, offset_seconds: float) -> Operation[None]:
        # Not float(): it took "5" and True, and raised ValueError or OverflowError.
        offset = validate.signed_seconds(offset_seconds, "clock offset", MAX_CLOCK_OFFSET_SECONDS)
        # Fixed-point: PostgreSQL's interval input refuses an exponent (5e-05).
        text = self.sql("set_clock_offset.sql").replace("{offset_seconds}", f"{offset:.6f}")
        return Operation((Statement(text),), ignore)
