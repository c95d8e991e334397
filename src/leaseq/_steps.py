"""Client calls that take more than one operation, written once for both clients.

Each function is a generator of operations (:data:`~leaseq._statement.Steps`):
it yields an operation, receives its result, decides what comes next. The sync
and the async client only run them (``Database.run_steps``), so the logic of a
call cannot drift between the two.
"""

from __future__ import annotations

import contextlib
import dataclasses
from datetime import datetime
from typing import Any, TypeVar

from . import _health
from ._errors import AlreadyCompleted, BacklogFull, JobNotFound, LeaseLost
from ._health_types import Health
from ._statement import Operation, Rows, Steps
from ._store import Claimed, ReplayBatch, Store
from ._types import Claim, Claims, Job

T = TypeVar("T")

#: How many times one claim() claims again for deferred jobs its claims made
#: ready (up to 1,000 each: claim_limited(), migrations 0017 and 0022). A claim
#: cannot take the jobs it made ready (nor, in their groups, the jobs after
#: them); past this many, claim() returns what it has and the next claim goes on.
STAGED_CLAIMS_AGAIN = 10


def claim(store: Store, queue: str, *, limit: int, lease: float | None) -> Steps[Claims]:
    """Claim; if the claim says repair notes are due, settle those keys (an
    ordering key met a producer in flight when it was last settled) and, if it
    came back empty, claim once more.

    A claim that put recovered leases back behind earlier jobs of their keys
    (claim.sql) took fewer jobs than it could: those earlier jobs became their
    keys' heads only after its snapshot. Claim again for the room left, as
    long as claims keep putting leases back (each puts back at least one, and
    there are only so many: it ends). Likewise a claim that made deferred
    grouped jobs ready (they came due since the last claim), a bounded number
    of times: jobs may keep coming due into groups without room.

    Jobs claimed are committed as running: once some are, the call must hand
    them over or give them back, never leave them to their leases' end unseen.
    A later statement that fails (a repair timed out, the connection lost)
    leaves the claims to be returned (due notes stay due, for the next claim);
    an interruption (a cancelled task, Ctrl-C) releases them before it goes on.
    """
    claimed: Claimed = yield store.claim(queue, limit=limit, lease=lease)
    claims, repairs_due = claimed.claims, claimed.repairs_due
    try:
        staged_again = 0
        while len(claims) < limit and (
            claimed.requeued or (claimed.staged and staged_again < STAGED_CLAIMS_AGAIN)
        ):
            staged_again += claimed.staged
            claimed = yield store.claim(queue, limit=limit - len(claims), lease=lease)
            # (whether a limit held the claim back: the latest claim knows)
            claims = Claims(
                claims + claimed.claims,
                held_back=claimed.claims.held_back,
                retry_in=claimed.claims.retry_in,
            )
            repairs_due = repairs_due or claimed.repairs_due
        if not repairs_due:
            return claims
        yield store.repair_keys(queue)
        if claims:
            return claims
        again: Claimed = yield store.claim(queue, limit=limit, lease=lease)
        return again.claims
    except GeneratorExit:
        raise  # closed: nothing may be yielded
    except Exception:
        if not claims:
            raise
        return claims
    except BaseException:
        if claims:
            with contextlib.suppress(Exception):  # the interruption is what propagates
                yield store.release(claims)
        raise


def enqueue(store: Store, known_queues: set[str], queue: str, operation: Operation[T]) -> Steps[T]:
    """An enqueue, after making sure the queue's settings row exists, committed on
    leaseq's own connection (detached): created inside the caller's transaction
    it would make every other producer of the queue wait until that commits.
    But a caller's transaction that reads one snapshot would not see that row,
    and the enqueue's own insert of it would fail (a serialization failure, for
    a lone producer): there it is made in the caller's transaction, unless it is
    committed already.

    Only a row seen committed makes the queue known: one made in the caller's
    transaction rolls back with it, and a queue taken for known then had its row
    made by a later enqueue inside its caller's transaction (admit()), so that
    every other producer of the queue waited for that one to commit.

    An operation of no statements (an empty batch) writes nothing, the queue's
    row included."""
    if queue not in known_queues and operation.statements:
        one_snapshot: bool = yield store.reads_one_snapshot()
        if not one_snapshot:
            ensure = store.ensure_queue(queue)
            yield Operation(ensure.statements, ensure.decode, detached=True)
            known_queues.add(queue)
        else:
            probe = store.queue_settings(queue)
            committed = yield Operation(probe.statements, probe.decode, detached=True)
            if committed is None:
                yield store.ensure_queue(queue)  # in the caller's transaction
            else:
                known_queues.add(queue)
    result: T = yield operation
    return result


def complete(store: Store, claim: Claim, *, result: Any, strict: bool) -> Steps[None]:
    """Complete one claim, or raise LeaseLost; strict (in a caller's transaction),
    AlreadyCompleted when this claim's completion has committed.

    A strict completion that waited for the row's lock while a first run of the
    same transaction committed misses (the UPDATE reads the newest row version),
    but its snapshot, taken before, shows the job still running: it said plain
    LeaseLost, and the caller could not tell the re-run from a lost lease. On
    that miss only, the row is read again, on a snapshot taken now; a completion
    costs no second round trip.
    """
    completion = store.complete_one(claim, result=result, strict=strict)
    if not strict:
        yield completion
        return
    lost: LeaseLost | None = yield _lost_returned(completion)
    if lost is None:
        return
    if not isinstance(lost, AlreadyCompleted):
        done: bool = yield store.completed_by(claim)
        if done:
            raise AlreadyCompleted(claim.job_id, claim.lease_version, "complete") from None
    raise lost


def _lost_returned(operation: Operation[None]) -> Operation[LeaseLost | None]:
    """``operation`` with its LeaseLost returned instead of raised (the steps
    decide what comes next; an error raised by an operation ends the steps)."""

    def decode(rows: list[Rows]) -> LeaseLost | None:
        try:
            operation.decode(rows)
        except LeaseLost as lost:
            return lost
        return None

    return Operation(operation.statements, decode, operation.retry_on, operation.detached)


def replay_failed(
    store: Store, queue: str, *, batch: int, actor: str | None = None
) -> Steps[list[int]]:
    """Replay a queue's failed jobs in batches (short transactions) as long as
    its backlog has room; BacklogFull, carrying the ids replayed, once it has not.

    The jobs failed when it begins, each once: one replayed by an earlier batch
    that workers failed again meanwhile (its bug not fixed yet) is left failed,
    not replayed round after round for as long as they keep up."""
    began: datetime = yield store.clock_now()
    replayed: list[int] = []
    while True:
        result: ReplayBatch = yield store.replay_failed(
            queue, limit=batch, actor=actor, failed_before=began
        )
        replayed += result.replayed
        if result.refused:
            raise BacklogFull(
                f"queue {queue} is full: replayed {len(replayed)} failed jobs, "
                f"{result.refused} or more left failed",
                replayed=tuple(replayed),
            )
        if result.exhausted:
            return replayed


def health(store: Store, *, long_transaction: float) -> Steps[Health]:
    """The schema's health, and whether it has every migration this code needs:
    a schema behind the code (deployed before `leaseq migrate` ran) is one that
    every worker of this code refuses, whatever its tables look like."""
    report: Health = yield store.health(long_transaction=long_transaction)
    if report.table("job") is None or report.table("migration") is None:
        return report  # not migrated at all: its warning says so already
    applied: set[int] = yield store.migrations_applied()
    behind = _health.schema_behind(store.schema, applied)
    if behind is None:
        return report
    return dataclasses.replace(
        report,
        warnings=(behind, *report.warnings),
        migrations_missing=_health.migrations_missing(applied),
    )


def get(store: Store, job_id: int) -> Steps[Job]:
    """The job; or JobNotFound saying where it went if retention archived it ("no
    job N" read as an id mistyped while the job sat in the archive)."""
    try:
        job: Job = yield store.get(job_id)
    except JobNotFound:
        raise (yield store.not_found(job_id)) from None
    return job
