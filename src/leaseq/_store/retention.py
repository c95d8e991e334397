"""Operations of retention: one bounded batch of a prune, or its dry run."""

from __future__ import annotations

from .. import _decoding as decoding
from .. import _validate as validate
from .. import _validate_operators as operator_input
from .. import _validate_settings as validate_settings
from .._statement import Operation, Rows, Statement
from .._types import PruneResult
from .base import StoreBase


class RetentionOperations(StoreBase):
    """What the maintenance leader and ``leaseq prune`` run."""

    def prune(
        self,
        *,
        queue: str | None = None,
        states: object = None,
        older_than: float | None = None,
        archived_older_than: float | None = None,
        limit: int = 1000,
        dry_run: bool = False,
        actor: str | None = None,
        lock_timeout: float | None = None,
    ) -> Operation[PruneResult]:
        """One batch, in one short transaction: up to ``limit`` finished jobs past
        their queue's retention (``older_than`` seconds instead, if given) deleted
        or moved to the archive, then up to ``limit`` archived jobs past the
        archive's retention deleted. ``dry_run`` counts all of them, writing nothing.
        The result's ``more`` says a batch was full. With ``actor``, what it
        removed is audited under that name (one row per queue and batch).
        ``lock_timeout``: seconds the batch may wait for a lock at most (the
        maintenance leader's), past which it writes nothing (TransientError)."""
        params = {
            "queue": None if queue is None else validate.queue_name(queue),
            "states": validate_settings.finished_states(states),
            "older_than": validate_settings.retention(older_than, "older_than"),
            "archived_older_than": validate_settings.retention(
                archived_older_than, "archived_older_than"
            ),
            "limit": validate_settings.prune_batch(limit),
            "actor": operator_input.actor(actor),
        }
        # A flag, not a truthy value: dry_run=0 pruned for real.
        if validate.flag(dry_run, "dry_run"):
            return Operation(
                (Statement(self.sql("prune_count.sql"), params),),
                lambda r: decoding.prune_from_rows(r[0], dry_run=True, more=False),
            )
        archive_params = {**params, "older_than": params["archived_older_than"]}

        def decode(rows: list[Rows]) -> PruneResult:
            moved, expired = rows[-2:]
            full = sum(row[3] for row in moved) >= limit or sum(row[3] for row in expired) >= limit
            return decoding.prune_from_rows(moved + expired, dry_run=False, more=full)

        waits: tuple[Statement, ...] = ()
        if lock_timeout is not None:
            seconds = validate.seconds(lock_timeout, "lock_timeout", 3600.0, allow_zero=False)
            # Whole milliseconds, at least one: the server takes 0 as no timeout at all.
            wait = {"lock_timeout": f"{max(1, round(seconds * 1000))}ms"}
            waits = (Statement(self.sql("prune_lock_timeout.sql"), wait),)
        return Operation(
            (
                *waits,
                Statement(self.sql("prune.sql"), params),
                Statement(self.sql("prune_archive.sql"), archive_params),
            ),
            decode,
        )
