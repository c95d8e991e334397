"""The workers' operations: claim, then the fenced writes (complete, renew, retry,
fail, release), each batched and still reported per claim."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar

from .. import _decoding as decoding
from .. import _validate as validate
from .. import _validate_payloads as payload_checks
from .._errors import AlreadyCompleted, InvalidArgument, LeaseLost
from .._statement import Operation, Rows, Statement, T
from .._types import RENEWAL_BUSY, Claim, Claims, JobStatus, RenewalBusy
from .base import StoreBase

#: Raised by job_running_key_idx when a claim lost a race for an ordering key.
UNIQUE_VIOLATION = "23505"


#: The claim statement's marker rows (a NULL job id), by their branch column.
REPAIRS_DUE_MARKER = 2
HELD_BACK_MARKER = 3
REQUEUED_MARKER = 4
STAGED_MARKER = 5


@dataclass(frozen=True, slots=True)
class Claimed:
    """What one claim statement returned: the claims (with whether a limit held
    the claim back), and whether repair notes of the queue are due (the client
    then runs :meth:`Store.repair_keys`)."""

    claims: Claims
    repairs_due: bool
    #: A recovered lease was put back behind an earlier job of its key, which is
    #: claimable only once the statement ended: claim again.
    requeued: bool = False
    #: Deferred grouped jobs came due and were made ready by the statement, too
    #: late for its own UPDATE: claim again.
    staged: bool = False


class JobOperations(StoreBase):
    """The worker's operations (the producers': producers.py)."""

    def claim(
        self, queue: str, *, limit: int = 1, lease: float | None = None
    ) -> Operation[Claimed]:
        params = {
            "queue": validate.queue_name(queue),
            "limit": validate.claim_limit(limit),
            "lease": validate.lease(lease),
        }
        schema = self.schema

        def decode(rows: list[Rows]) -> Claimed:
            claims = Claims(decoding.claim_from_row(schema, r) for r in rows[0] if r[0] is not None)
            for row in rows[0]:  # the marker rows (no job id) come last
                if row[0] is None and row[17] == HELD_BACK_MARKER:
                    claims.held_back, claims.retry_in = True, row[18]
            repairs_due = any(r[0] is None and r[17] == REPAIRS_DUE_MARKER for r in rows[0])
            requeued = any(r[0] is None and r[17] == REQUEUED_MARKER for r in rows[0])
            staged = any(r[0] is None and r[17] == STAGED_MARKER for r in rows[0])
            return Claimed(claims, repairs_due, requeued, staged)  # in claim order (claim.sql)

        return Operation(
            (Statement(self.sql("claim.sql"), params),),
            decode,
            retry_on=frozenset({UNIQUE_VIOLATION}),
            undo=self.give_back,
        )

    def give_back(self, claimed: Claimed) -> Operation[list[tuple[Claim, bool]]] | None:
        """The release of claims their caller never got (a claim interrupted after
        it committed): runnable again at once, the attempt not counted."""
        return self.release(claimed.claims) if claimed.claims else None

    def repair_keys(self, queue: str, *, limit: int = 100) -> Operation[int]:
        """Settle the ordering keys of ``queue`` whose repair notes are due."""
        params = {"queue": validate.queue_name(queue), "limit": validate.claim_limit(limit)}
        return Operation(
            (Statement(self.sql("repair_keys.sql"), params),), lambda r: int(r[0][0][0])
        )

    def complete(
        self,
        claims: Sequence[Claim],
        *,
        results: Sequence[Any] | None = None,
        strict: bool = False,
    ) -> Operation[list[tuple[Claim, bool]]]:
        """Per claim: True if completed, False if lost; ``results`` (one per claim,
        None for none) are stored with the completions.

        Not strict, a completion this claim already committed counts as done (a
        resend). Strict (inside a caller's transaction, where an effect commits
        with it), it is refused: a re-run of that transaction must not commit twice.
        """
        claims = validate.claims(claims)
        return self._fenced(
            "complete.sql",
            claims,
            self._completion(results, claims, strict),
            lambda row: bool(row[2]),
        )

    def _completion(
        self, results: Sequence[Any] | None, claims: Sequence[Claim], strict: bool
    ) -> dict[str, Any]:
        return {
            "strict": strict,
            "results": payload_checks.results(results, len(claims)),
            "results_channel": self.results_channel if self._notify_channel else None,
        }

    def renew(
        self, claims: Sequence[Claim], lease: float | None = None
    ) -> Operation[list[tuple[Claim, datetime | RenewalBusy | None]]]:
        """Per claim: the new lease_until; RENEWAL_BUSY if another transaction holds the
        job's row locked right now while its lease is still live (unchanged: try again);
        None if the lease was lost. Never waits for a locked row."""
        claims = validate.claims(claims)
        leases = [validate.lease(lease)] * len(claims)
        return self._fenced(
            "renew.sql",
            claims,
            {"leases": leases},
            lambda row: RENEWAL_BUSY if row[3] else row[2],
        )

    def retry(
        self,
        claims: Sequence[Claim],
        *,
        delays: Sequence[float | None] | None = None,
        errors: Sequence[object] | None = None,
        strict: bool = False,
    ) -> Operation[list[tuple[Claim, JobStatus | None]]]:
        """Per claim: the job's new status (queued, or failed when exhausted), None if lost.

        A None delay takes the queue's backoff. Not strict, a retry this claim
        already committed is reported again; strict (in a caller's transaction),
        it is refused.
        """
        claims = validate.claims(claims)
        extra = {
            "strict": strict,
            "delays": [
                None if d is None else validate.seconds(d, "delay", validate.MAX_DELAY_SECONDS)
                for d in validate.aligned(delays, claims, "delays")
            ],
            "errors": validate.error_texts(errors, claims),
            "results_channel": self.results_channel if self._notify_channel else None,
        }
        return self._fenced(
            "retry.sql", claims, extra, lambda row: None if row[2] is None else JobStatus(row[2])
        )

    def fail(
        self,
        claims: Sequence[Claim],
        errors: Sequence[object] | None = None,
        *,
        strict: bool = False,
    ) -> Operation[list[tuple[Claim, bool]]]:
        """Per claim: True if failed (now, or by this claim before unless strict), False if lost."""
        claims = validate.claims(claims)
        extra = {
            "strict": strict,
            "errors": validate.error_texts(errors, claims),
            "results_channel": self.results_channel if self._notify_channel else None,
        }
        return self._fenced("fail.sql", claims, extra, lambda row: bool(row[2]))

    def release(
        self, claims: Sequence[Claim], *, handlers_running: Sequence[bool] | None = None
    ) -> Operation[list[tuple[Claim, bool]]]:
        """Give unfinished claims back (shutdown); the attempt is not counted. A claim
        whose handler still runs (``handlers_running``) may run again only once its
        lease would have ended.

        Per claim: True if released (now or by an earlier commit of this claim)."""
        claims = validate.claims(claims)
        running = (
            [False] * len(claims)
            if handlers_running is None
            else [
                validate.flag(v, "handlers_running")
                for v in validate.aligned(handlers_running, claims, "handlers_running")
            ]
        )
        return self._fenced(
            "release.sql", claims, {"handlers_running": running}, lambda row: bool(row[2])
        )

    def _fenced(
        self,
        name: str,
        claims: Sequence[Claim],
        extra: dict[str, Any],
        result: Callable[[tuple[Any, ...]], T],
    ) -> Operation[list[tuple[Claim, T]]]:
        if len({c.job_id for c in claims}) != len(claims):
            raise InvalidArgument("a batch must not hold the same job twice")
        params = {
            "job_ids": [c.job_id for c in claims],
            "lease_versions": [c.lease_version for c in claims],
            **extra,
        }

        def decode(rows: list[Rows]) -> list[tuple[Claim, T]]:
            # Rows (job_id, written, verdict...): one per job the write changed,
            # one per claim as the statement's snapshot saw it; the written wins.
            verdicts: dict[int, T] = {}
            for row in rows[0]:
                if row[1] or row[0] not in verdicts:
                    verdicts[row[0]] = result(row)
            return [(c, verdicts[c.job_id]) for c in claims]

        return Operation((Statement(self.sql(name), params),), decode)

    # The single-claim forms raise LeaseLost instead of reporting it.

    def complete_one(
        self, claim: Claim, *, result: Any = None, strict: bool = False
    ) -> Operation[None]:
        """Complete one claim, or raise LeaseLost (AlreadyCompleted, when strict and
        this claim's completion committed before the statement's snapshot: one
        that committed while the statement waited for the row is asked about
        afterwards, by ``_steps.complete`` with :meth:`completed_by`)."""
        claim = validate.claim(claim)
        batch = self._fenced(
            "complete.sql",
            [claim],
            self._completion([result], [claim], strict),
            lambda row: (bool(row[2]), bool(row[3])),
        )

        def decode(rows: list[Rows]) -> None:
            ((_, (accepted, already_done)),) = batch.decode(rows)
            if already_done and not accepted:
                raise AlreadyCompleted(claim.job_id, claim.lease_version, "complete")
            if not accepted:
                raise LeaseLost(claim.job_id, claim.lease_version, "complete")

        return Operation(batch.statements, decode)

    def completed_by(self, claim: Claim) -> Operation[bool]:
        """Whether ``claim``'s completion has committed, on a snapshot taken now."""
        params = {"job_id": claim.job_id, "lease_version": claim.lease_version}
        return Operation(
            (Statement(self.sql("completed_by.sql"), params),), lambda rows: bool(rows[0][0][0])
        )

    def hold_for_completion(self, claim: Claim) -> Operation[None]:
        """First in a caller's transaction that will complete ``claim``: in REPEATABLE
        READ or SERIALIZABLE, lock the job's row (fenced: LeaseLost), so that no
        renewal changes it under the transaction's snapshot; in READ COMMITTED,
        nothing (hold_for_completion.sql)."""
        claim = validate.claim(claim)
        params = {"job_id": claim.job_id, "lease_version": claim.lease_version}

        def decode(rows: list[Rows]) -> None:
            one_snapshot, held = rows[0][0]
            if one_snapshot and not held:
                raise LeaseLost(claim.job_id, claim.lease_version, "complete")

        return Operation((Statement(self.sql("hold_for_completion.sql"), params),), decode)

    def renew_one(self, claim: Claim, lease: float | None = None) -> Operation[datetime]:
        """The new lease_until, or LeaseLost. Unlike the batch it waits for a locked row
        (as the other single-claim writes do), so the answer is never "busy"."""
        claim = validate.claim(claim)
        params = {
            "job_id": claim.job_id,
            "lease_version": claim.lease_version,
            "lease": validate.lease(lease),
        }

        def decode(rows: list[Rows]) -> datetime:
            if not rows[0]:
                raise LeaseLost(claim.job_id, claim.lease_version, "renew")
            until: datetime = rows[0][0][0]
            return until

        return Operation((Statement(self.sql("renew_one.sql"), params),), decode)

    def retry_one(
        self,
        claim: Claim,
        *,
        delay: float | None = None,
        error: object = None,
        strict: bool = False,
    ) -> Operation[JobStatus]:
        operation = self.retry([claim], delays=[delay], errors=[error], strict=strict)
        return _only(operation, "retry", lambda status: status or _LOST)

    def fail_one(
        self, claim: Claim, error: object = None, *, strict: bool = False
    ) -> Operation[None]:
        operation = self.fail([claim], [error], strict=strict)
        return _only(operation, "fail", lambda ok: None if ok else _LOST)


_LOST: Any = object()
R = TypeVar("R")


def _only(
    batch: Operation[list[tuple[Claim, R]]], name: str, outcome: Callable[[R], T]
) -> Operation[T]:
    """The one-claim form of a fenced batch: its outcome, or LeaseLost."""

    def decode(rows: list[Rows]) -> T:
        ((claim, result),) = batch.decode(rows)
        value = outcome(result)
        if value is _LOST:
            raise LeaseLost(claim.job_id, claim.lease_version, name)
        return value

    return Operation(batch.statements, decode)
