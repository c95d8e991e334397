"""Operations of operators: reap, replay, cancel, look, configure (stats: monitoring.py)."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from .. import _decoding as decoding
from .. import _validate as validate
from .. import _validate_operators as operator_input
from .. import _validate_settings as validate_settings
from .._errors import (
    BacklogFull,
    InvalidArgument,
    JobFailed,
    JobNotFound,
    PayloadTooLarge,
    ResultNotReady,
    UniqueKeyHeld,
)
from .._statement import Operation, Rows, Statement
from .._types import Job, JobStatus, QueueSettings, ReapResult
from .base import StoreBase, ignore

#: A bulk replay sees a key free in its snapshot, while a producer's enqueue of
#: that key commits before the statement's trigger takes the key's lock: the
#: trigger raises LQ003 and the statement writes nothing. Sent again, it sees the
#: holder and leaves that job as it is (held), replaying the rest.
RACED_FOR_A_KEY = frozenset({"LQ003"})


@dataclass(frozen=True, slots=True)
class ReplayBatch:
    """One batch of replay_failed: ids replayed, how many the queue had no room
    for, and whether the batch reached the end of the queue's failed jobs."""

    replayed: list[int]
    refused: int
    exhausted: bool


class OperatorOperations(StoreBase):
    """What operators (the CLI, the reaper, a dashboard) run."""

    def reap(self, *, limit: int = 1000) -> Operation[ReapResult]:
        params = {
            "limit": validate.claim_limit(limit),
            "results_channel": self.results_channel if self._notify_channel else None,
        }

        def decode(rows: list[Rows]) -> ReapResult:
            return ReapResult(
                exhausted_queued=tuple(r[0] for r in rows[0] if r[1] == "queued"),
                expired_running=tuple(r[0] for r in rows[0] if r[1] == "running"),
                by_queue=dict(Counter(r[2] for r in rows[0])),
            )

        return Operation(
            (
                Statement(self.sql("reap.sql"), params),
                Statement(self.sql("key_hold_expire.sql")),
                Statement(self.sql("slot_hold_expire.sql")),
                Statement(self.sql("group_rate_expire.sql")),
                Statement(self.sql("waiter_expire.sql")),
            ),
            decode,
        )

    def replay(self, job_id: int, *, actor: str | None = None) -> Operation[bool]:
        """True if replayed, False if the job was not failed or cancelled;
        BacklogFull (nothing written) if its queue has no room for it;
        PayloadTooLarge if its payload is larger than its queue takes now;
        UniqueKeyHeld if another job of its queue holds its unique key."""
        params = self._replay_params([operator_input.job_id(job_id)], None, 1, actor)

        def decode(rows: list[Rows]) -> bool:
            if not rows[0]:
                raise _not_found(job_id, rows[1])
            ((_, status, changed, refused, held, too_large, limit, size),) = rows[0]
            if refused:
                raise BacklogFull(f"queue of job {job_id} is full: {status} job not replayed")
            if too_large is not None:
                # Before held: a key is let go of some day, this limit stays.
                raise PayloadTooLarge(
                    f"job {job_id} not replayed: its payload of {size} bytes is larger than "
                    f"its queue's {too_large} of {limit} bytes now, so it can never fit "
                    "(raise the limit to replay it)"
                )
            if held:
                raise UniqueKeyHeld(
                    f"job {job_id} not replayed: another job of its queue holds its unique key"
                )
            return bool(changed)

        return Operation(
            (Statement(self.sql("replay.sql"), params), self._archived(job_id)), decode
        )

    def replay_many(
        self,
        job_ids: Sequence[int],
        *,
        actor: str | None = None,
        only_failed: bool = False,
        lease_versions: Sequence[int] | None = None,
    ) -> Operation[list[int]]:
        """Replay those of the jobs that are failed or cancelled (``only_failed``:
        failed), in one statement; their ids. BacklogFull (carrying them) if a
        queue had no room for some. A unique job whose key another job holds is
        left as it is; so is one whose payload is larger than its queue takes now
        (taking no room), and one whose lease_version is no longer the one given
        for it in ``lease_versions`` (one per id)."""
        ids = operator_input.job_ids(job_ids)
        params = self._replay_params(ids, None, max(len(ids), 1), actor)
        if validate.flag(only_failed, "only_failed"):
            params["statuses"] = ["failed"]
        if lease_versions is not None:
            params["lease_versions"] = operator_input.lease_versions(lease_versions, ids)

        def decode(rows: list[Rows]) -> list[int]:
            replayed = [row[0] for row in rows[0] if row[2]]
            refused = sum(1 for row in rows[0] if row[3])
            if refused:
                raise BacklogFull(
                    f"queue full: replayed {len(replayed)} jobs, {refused} left as they were",
                    replayed=tuple(replayed),
                )
            return replayed

        return Operation(
            (Statement(self.sql("replay.sql"), params),), decode, retry_on=RACED_FOR_A_KEY
        )

    def replay_failed(
        self,
        queue: str,
        *,
        limit: int = 1000,
        actor: str | None = None,
        failed_before: datetime | None = None,
    ) -> Operation[ReplayBatch]:
        """Replay one batch of up to ``limit`` failed jobs of ``queue``, oldest first,
        as many as its backlog limits have room for; with ``failed_before``, only
        jobs that failed by then (by the schema's clock). Jobs whose unique key is
        held, or whose payload is larger than the queue takes now, are left out."""
        params = self._replay_params(
            [], validate.queue_name(queue), validate.claim_limit(limit), actor
        )
        # Failed jobs only, checked again on the locked row: one skipped (cancelled)
        # while this batch waited for its lock stays skipped.
        params["statuses"] = ["failed"]
        params["failed_before"] = failed_before

        def decode(rows: list[Rows]) -> ReplayBatch:
            return ReplayBatch(
                replayed=[row[0] for row in rows[0] if row[2]],
                refused=sum(1 for row in rows[0] if row[3]),
                exhausted=len(rows[0]) < limit,
            )

        return Operation(
            (Statement(self.sql("replay.sql"), params),), decode, retry_on=RACED_FOR_A_KEY
        )

    @staticmethod
    def _replay_params(
        job_ids: list[int], queue: str | None, limit: int, actor: str | None
    ) -> dict[str, Any]:
        return {
            "job_ids": job_ids,
            "queue": queue,
            "limit": limit,
            "actor": operator_input.actor(actor),
            "statuses": ["failed", "cancelled"],
            "lease_versions": None,
            "failed_before": None,
        }

    def cancel(
        self,
        job_id: int,
        *,
        running: bool = False,
        only_failed: bool = False,
        lease_version: int | None = None,
        actor: str | None = None,
    ) -> Operation[bool]:
        params = {
            "job_id": operator_input.job_id(job_id),
            "running": validate.flag(running, "running"),
            "only_failed": validate.flag(only_failed, "only_failed"),
            "lease_version": (
                None if lease_version is None else operator_input.lease_version(lease_version)
            ),
            "actor": operator_input.actor(actor),
            "channel": self._notify_channel,
            "results_channel": self.results_channel if self._notify_channel else None,
        }

        def decode(rows: list[Rows]) -> bool:
            if not rows[0]:
                raise _not_found(job_id, rows[1])
            return bool(rows[0][0][2])

        return Operation(
            (Statement(self.sql("cancel.sql"), params), self._archived(job_id)), decode
        )

    def _archived(self, job_id: int) -> Statement:
        """Where the job went if retention archived it (read with an action on it:
        "no job N" read as an id mistyped while the job sat in the archive)."""
        return Statement(self.sql("job_archived.sql"), {"job_id": operator_input.job_id(job_id)})

    def not_found(self, job_id: int) -> Operation[JobNotFound]:
        """The JobNotFound of a job ``get`` found no row of: where it went if
        retention archived it, else the two reasons left (read only then: a job
        found costs ``get`` its one statement)."""

        def decode(rows: list[Rows]) -> JobNotFound:
            if not rows[0]:
                return JobNotFound(
                    f"no job {job_id}: never enqueued in this schema, or finished and "
                    "deleted by retention"
                )
            return _not_found(
                job_id,
                rows[0],
                "(the job_archive table keeps it for the record until the queue's "
                "retain_archived ends)",
            )

        return Operation((self._archived(job_id),), decode)

    def get(self, job_id: int) -> Operation[Job]:
        schema = self.schema

        def decode(rows: list[Rows]) -> Job:
            if not rows[0]:
                raise JobNotFound(f"no job {job_id}")
            row = rows[0][0]
            return decoding.job_from_row(schema, row, blocked_by=row[24])

        return Operation(
            (Statement(self.sql("get_job.sql"), {"job_id": operator_input.job_id(job_id)}),), decode
        )

    def result(self, job_id: int) -> Operation[Any]:
        """A done job's result (None if its handler returned none); JobNotFound,
        ResultNotReady (queued or running) or JobFailed (failed or cancelled)."""
        checked = operator_input.job_id(job_id)

        def decode(rows: list[Rows]) -> Any:
            if not rows[0]:
                # Say the likelier reason of the two: a short retain_done removes
                # a finished job before a slow waiter reads its result.
                raise JobNotFound(
                    f"no job {checked}: never enqueued in this schema, or finished and "
                    "removed by retention (the queue's retain_done)"
                )
            ((status, value, error),) = rows[0]
            if status == JobStatus.DONE:
                return value
            if status in (JobStatus.QUEUED, JobStatus.RUNNING):
                raise ResultNotReady(f"job {checked} is {status}: it has no result yet")
            raise JobFailed(
                f"job {checked} is {status}" + (f": {error}" if error else ""),
                job_id=checked,
                status=status,
                error=error,
            )

        return Operation((Statement(self.sql("job_result.sql"), {"job_id": checked}),), decode)

    def await_result(self, job_id: int) -> Operation[bool]:
        """Mark the job as waited for: its end notifies the results channel. False
        while another transaction holds its row (not waited for: try again)."""
        return Operation(
            (Statement(self.sql("await_result.sql"), {"job_id": operator_input.job_id(job_id)}),),
            lambda rows: bool(rows[0][0][0]),
        )

    def list_jobs(
        self, status: JobStatus | str, *, queue: str | None = None, limit: int = 100
    ) -> Operation[list[Job]]:
        try:
            state = JobStatus(status)
        except ValueError:
            raise InvalidArgument(f"unknown job status {status!r}") from None
        params = {
            "status": state.value,
            "queue": None if queue is None else validate.queue_name(queue),
            "limit": validate.claim_limit(limit),
        }
        schema = self.schema
        return Operation(
            (Statement(self.sql("list_jobs.sql"), params),),
            lambda r: [decoding.job_from_row(schema, row) for row in r[0]],
        )

    def configure_queue(
        self, name: str, *, actor: str | None = None, **settings: Any
    ) -> Operation[QueueSettings]:
        params: dict[str, Any] = {
            "name": validate.queue_name(name),
            **validate_settings.queue_settings(settings),
        }
        named = {"name": params["name"]}
        if not settings:
            # Shown, not changed: a queue never used gets no row (it would then
            # be listed as a queue), but its defaults are shown as the table's
            # own, read from a row made in a savepoint and rolled back.
            return Operation(
                (
                    Statement(self.sql("settings_probe_begin.sql")),
                    Statement(self.sql("configure_queue_ensure.sql"), named),
                    Statement(self.sql("get_queue.sql"), named),
                    Statement(self.sql("settings_probe_end.sql")),
                ),
                lambda r: decoding.settings_from_row(r[2][0]),
            )
        audit = {
            **named,
            "actor": operator_input.actor(actor),
            "action": _settings_action(settings),
            "detail": json.dumps(settings, default=str),
        }
        return Operation(
            (
                Statement(self.sql("configure_queue_ensure.sql"), named),
                Statement(
                    self.sql("policy_change_lock.sql"),
                    {"set_ordering_policy": params["set_ordering_policy"]},
                ),
                Statement(self.sql("configure_queue_update.sql"), params),
                Statement(self.sql("mark_running_limited.sql"), named),
                Statement(self.sql("count_backlog.sql"), named),
                Statement(
                    self.sql("settle_failed_keys.sql"),
                    {**named, "set_ordering_policy": params["set_ordering_policy"]},
                ),
                Statement(self.sql("configure_queue_audit.sql"), audit),
                Statement(self.sql("get_queue.sql"), named),
            ),
            lambda r: decoding.settings_from_row(r[-1][0]),
        )

    def ensure_queue(self, name: str) -> Operation[None]:
        """Create the queue's settings row with defaults if it does not exist."""
        params = {"name": validate.queue_name(name)}
        return Operation((Statement(self.sql("configure_queue_ensure.sql"), params),), ignore)

    def reads_one_snapshot(self) -> Operation[bool]:
        """Whether the transaction it runs in reads from one snapshot (repeatable
        read, serializable): rows committed elsewhere after it began are not its
        to see, and its insert of one is a serialization failure."""
        return Operation(
            (Statement(self.sql("reads_one_snapshot.sql")),), lambda r: bool(r[0][0][0])
        )

    def queue_settings(self, name: str) -> Operation[QueueSettings | None]:
        params = {"name": validate.queue_name(name)}
        return Operation(
            (Statement(self.sql("get_queue.sql"), params),),
            lambda r: decoding.settings_from_row(r[0][0]) if r[0] else None,
        )


def _settings_action(settings: dict[str, Any]) -> str:
    """The audit log's name for a settings change: pausing and resuming stand out."""
    if set(settings) == {"paused"}:
        return "pause" if settings["paused"] else "resume"
    return "configure"


def _not_found(
    job_id: int,
    archived: Rows,
    kept: str = "(an archived job is kept to be read, not replayed or cancelled)",
) -> JobNotFound:
    if not archived:
        return JobNotFound(f"no job {job_id}")
    status, at = archived[0]
    return JobNotFound(
        f"no job {job_id} in its queue: it was {status}, and retention moved it to the "
        f"archive at {at.isoformat(timespec='seconds')} {kept}"
    )
