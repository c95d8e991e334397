"""Operations that let operators look into queues (a dashboard, the CLI): searches
and summaries whose cost is bounded whatever the size of the job table."""

from __future__ import annotations

from typing import Any

from .. import _decoding as decoding
from .. import _validate as validate
from .. import _validate_operators as operator_input
from .. import _validate_payloads as payload_checks
from .._errors import InvalidArgument
from .._statement import Operation, Rows, Statement
from .._types import (
    ActivityMinute,
    AuditEntry,
    BlockedKey,
    FailedGroup,
    FailedSummary,
    Job,
    JobPage,
    JobStatus,
    QueueActivity,
)
from .base import StoreBase

#: The newest failed jobs of each queue read to group them by error; the keys
#: with a failed head read at most, and the jobs counted at most behind one:
#: enough to see what is wrong, bounded on any table.
FAILED_GROUPS_CAP = 500
BLOCKED_KEYS_CAP = 1000
WAITING_CAP = 10_000
#: Finished jobs of one queue and state counted at most for its activity (index
#: entries), and the done jobs whose durations make its percentiles (rows).
ACTIVITY_CAP = 20_000
DURATION_SAMPLE = 1000
MAX_PAGE = 1000
MAX_MINUTES = 24 * 60


def _page_limit(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_PAGE:
        raise InvalidArgument(f"limit must be an integer in [1, {MAX_PAGE}], got {value!r}")
    return value


def _queue(queue: str | None) -> str | None:
    return None if queue is None else validate.queue_name(queue)


class InspectionOperations(StoreBase):
    """Searches and summaries of a schema's jobs and of its audit log."""

    def find_jobs(
        self,
        *,
        queue: str | None = None,
        status: JobStatus | str | None = None,
        key: str | None = None,
        error: str | None = None,
        payload: dict[str, Any] | None = None,
        before: int | None = None,
        limit: int = 50,
        window: int = 10_000,
        window_top: int | None = None,
    ) -> Operation[JobPage]:
        limit = _page_limit(limit)
        params = {
            "queue": _queue(queue),
            "status": None if status is None else operator_input.job_status(status).value,
            "key": operator_input.search_text(key, "ordering key"),
            "error": operator_input.search_text(error, "error text"),
            "payload": payload_checks.payload_filter(payload),
            "before": None if before is None else operator_input.job_id(before),
            "limit": limit,
            "window": operator_input.search_window(window),
            "top": None if window_top is None else operator_input.job_id(window_top, "window_top"),
        }
        schema = self.schema
        # Failed jobs are kept however old (until replayed), and newer jobs of any
        # queue push them out of the id window: their search reads the window as
        # any search does, then, if the page is not full, older failures through
        # their index (the newest `window` of each queue). Done and cancelled jobs
        # (the long history) keep the id window; running jobs of any age are what
        # running_jobs() lists.
        failed = params["status"] == JobStatus.FAILED.value
        sql = self.sql("find_failed_jobs.sql" if failed else "find_jobs.sql")

        def decode(rows: list[Rows]) -> JobPage:
            # find_jobs.sql: the window's floor; find_failed_jobs.sql: whether a queue
            # had more failures than the window. Then the window's top, for the next page.
            *_, edge, top = rows[-1][0]
            found = [row for row in rows[-1] if row[0] is not None]
            jobs = tuple(decoding.job_from_row(schema, row) for row in found[:limit])
            more = len(found) > limit
            return JobPage(
                jobs=jobs,
                next_before=jobs[-1].job_id if more else None,
                # The search reached the window's edge and jobs may lie beyond it.
                window_end=not more and (bool(edge) if failed else edge > 0),
                window_top=top or None,
            )

        search = Statement(sql, params)
        if failed:  # its plan settings first, in its transaction
            return Operation((Statement(self.sql("search_settings.sql"), {}), search), decode)
        return Operation((search,), decode)

    def running_jobs(self, queue: str | None = None, *, limit: int = 100) -> Operation[list[Job]]:
        params = {"queue": _queue(queue), "limit": _page_limit(limit)}
        schema = self.schema
        return Operation(
            (Statement(self.sql("running_jobs.sql"), params),),
            lambda r: [decoding.job_from_row(schema, row) for row in r[0]],
        )

    def failed_groups(
        self, queue: str | None = None, *, limit: int = 50
    ) -> Operation[FailedSummary]:
        params = {"queue": _queue(queue), "limit": _page_limit(limit), "cap": FAILED_GROUPS_CAP}

        def decode(rows: list[Rows]) -> FailedSummary:
            groups = tuple(
                FailedGroup(queue=r[0], error=r[1], count=r[2], newest_job_id=r[3], newest_at=r[4])
                for r in rows[0]
            )
            scanned, capped = (rows[0][0][5], rows[0][0][6]) if rows[0] else (0, False)
            return FailedSummary(groups=groups, scanned=scanned, capped=capped)

        return Operation((Statement(self.sql("failed_groups.sql"), params),), decode)

    def blocked_keys(
        self, queue: str | None = None, *, limit: int = 100
    ) -> Operation[list[BlockedKey]]:
        params = {
            "queue": _queue(queue),
            "limit": _page_limit(limit),
            "cap": BLOCKED_KEYS_CAP,
            "waiting_cap": WAITING_CAP,
        }

        def decode(rows: list[Rows]) -> list[BlockedKey]:
            return [
                BlockedKey(
                    queue=r[0],
                    key=r[1],
                    head_job_id=r[2],
                    head_error=r[3],
                    failed_at=r[4],
                    waiting=min(r[5], WAITING_CAP),
                    waiting_capped=r[5] > WAITING_CAP,
                    head_lease_version=r[6],
                )
                for r in rows[0]
            ]

        return Operation((Statement(self.sql("blocked_keys.sql"), params),), decode)

    def activity(
        self, queue: str | None = None, *, minutes: int = 60
    ) -> Operation[list[QueueActivity]]:
        if isinstance(minutes, bool) or not isinstance(minutes, int):
            raise InvalidArgument(f"minutes must be an integer, got {minutes!r}")
        if not 1 <= minutes <= MAX_MINUTES:
            raise InvalidArgument(f"minutes must be in [1, {MAX_MINUTES}], got {minutes}")
        params = {
            "queue": _queue(queue),
            "minutes": minutes,
            "cap": ACTIVITY_CAP,
            "sample": DURATION_SAMPLE,
        }

        def decode(rows: list[Rows]) -> list[QueueActivity]:
            return [
                QueueActivity(
                    queue=name,
                    per_minute=tuple(
                        ActivityMinute(start=s, done=d, failed=f)
                        for s, d, f in zip(starts, done, failed, strict=True)
                    ),
                    p50=p50,
                    p95=p95,
                    p99=p99,
                    sampled=bool(sampled),
                )
                for name, starts, done, failed, p50, p95, p99, sampled in rows[0]
            ]

        return Operation((Statement(self.sql("activity.sql"), params),), decode)

    def audit_log(
        self, *, queue: str | None = None, before: int | None = None, limit: int = 50
    ) -> Operation[list[AuditEntry]]:
        params = {
            "queue": _queue(queue),
            # An audit_id, not a job id: named as the caller gave it.
            "before": None if before is None else operator_input.job_id(before, "before"),
            "limit": _page_limit(limit),
        }
        return Operation(
            (Statement(self.sql("audit_log.sql"), params),),
            lambda r: [
                AuditEntry(
                    audit_id=a,
                    at=at,
                    actor=actor,
                    action=action,
                    queue=queue,
                    job_ids=tuple(ids),
                    detail=detail,
                    db_role=db_role,
                )
                for a, at, actor, db_role, action, queue, ids, detail in r[0]
            ],
        )
