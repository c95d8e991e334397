"""The producers' operations: enqueue one job, or many in one statement, plain or
unique; every argument checked before anything is sent."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

from .. import _validate as validate
from .. import _validate_payloads as payload_checks
from .._errors import InvalidJob
from .._job_ids import JobId, JobIds
from .._statement import Operation, Rows, Statement
from .base import StoreBase


class ProducerOperations(StoreBase):
    """Enqueue, in the caller's transaction or not (the client decides)."""

    def enqueue(
        self,
        queue: str,
        payload: Any,
        *,
        delay: float | None = None,
        run_at: datetime | None = None,
        priority: int = 0,
        max_attempts: int | None = None,
        key: str | None = None,
        seq: int | None = None,
        idempotency_key: str | None = None,
        timeout: float | None = None,
        unique_key: str | None = None,
        unique_for: float | None = None,
        group: str | None = None,
        trace_context: Mapping[str, str] | None = None,
    ) -> Operation[JobId]:
        encoded = payload_checks.payload(payload, self.max_payload_bytes)
        ordering_key, ordering_seq = validate.ordering(key, seq)
        unique, held_for = validate.unique(unique_key, unique_for)
        params = {
            "queue": validate.queue_name(queue),
            "channel": self._notify_channel,
            "payload": encoded.text,
            "payload_bytes": encoded.size,
            **self._schedule(delay, run_at, priority, max_attempts),
            "key": ordering_key,
            "seq": ordering_seq,
            "idempotency_key": None
            if idempotency_key is None
            else validate.text_key(idempotency_key, "idempotency key"),
            "trace_context": _trace_context(trace_context),
            "timeout": validate.job_timeout(timeout),
            "group": None if group is None else validate.text_key(group, "group"),
        }
        if unique is None:
            return Operation(
                (Statement(self.sql("enqueue.sql"), params),), lambda r: JobId(r[0][0][0])
            )
        params |= {"unique_key": unique, "unique_for": held_for}
        return Operation(
            (Statement(self.sql("enqueue_unique.sql"), params),),
            lambda r: JobId(r[0][0][0], existing=r[0][0][1]),
        )

    def enqueue_many(
        self,
        queue: str,
        payloads: Iterable[Any],
        *,
        delay: float | None = None,
        run_at: datetime | None = None,
        priority: int = 0,
        max_attempts: int | None = None,
        key: str | None = None,
        seqs: Sequence[int] | None = None,
        timeout: float | None = None,
        unique_keys: Sequence[str] | None = None,
        unique_for: float | None = None,
        group: str | None = None,
        trace_context: Mapping[str, str] | None = None,
    ) -> Operation[JobIds]:
        encoded = [
            payload_checks.payload(p, self.max_payload_bytes)
            for p in payload_checks.payload_batch(payloads)
        ]
        total_bytes = payload_checks.batch_size(e.size for e in encoded)
        if seqs is not None:
            payload_checks.per_payload(seqs, len(encoded), "seqs")
        ordering = [
            validate.ordering(key, None if seqs is None else seqs[i]) for i in range(len(encoded))
        ]
        params = {
            "queue": validate.queue_name(queue),
            "channel": self._notify_channel,
            "payloads": [e.text for e in encoded],
            "payload_bytes": [e.size for e in encoded],
            **self._schedule(delay, run_at, priority, max_attempts),
            "key": ordering[0][0] if ordering else None,
            "seqs": [seq for _, seq in ordering],
            "trace_context": _trace_context(trace_context),
            "timeout": validate.job_timeout(timeout),
            "group": None if group is None else validate.text_key(group, "group"),
        }
        if unique_keys is None:
            if unique_for is not None:
                raise InvalidJob("unique_for needs unique_keys")
            params |= {
                "count": len(encoded),
                "total_bytes": total_bytes,
                "largest_bytes": max((e.size for e in encoded), default=0),
            }
            if not encoded:  # (admission would refuse it from a full queue)
                return Operation((), lambda _: JobIds([]))
            return Operation(
                (Statement(self.sql("enqueue_many.sql"), params),),
                lambda r: JobIds(sorted(row[0] for row in r[0])),
            )
        payload_checks.per_payload(unique_keys, len(encoded), "unique_keys")
        keys = [validate.text_key(k, "unique key") for k in unique_keys]
        params |= {"unique_keys": keys, "unique_for": validate.unique_window(unique_for)}
        if not keys:
            return Operation((), lambda _: JobIds([]))

        def decode(r: list[Rows]) -> JobIds:
            rows = sorted(r[0])  # (position, job_id, existing), by input position
            return JobIds(
                [job_id for _, job_id, _ in rows], existing=[found for _, _, found in rows]
            )

        return Operation((Statement(self.sql("enqueue_many_unique.sql"), params),), decode)

    @staticmethod
    def _schedule(
        delay: float | None, run_at: datetime | None, priority: int, max_attempts: int | None
    ) -> dict[str, Any]:
        if delay is not None and run_at is not None:
            raise InvalidJob("give delay or run_at, not both")
        return {
            "delay": validate.delay(delay),
            "run_at": validate.run_at(run_at),
            "priority": validate.integer(priority, "priority", validate.PRIORITY_RANGE),
            "max_attempts": None
            if max_attempts is None
            else validate.integer(max_attempts, "max_attempts", range(1, 1001)),
        }


def _trace_context(context: Mapping[str, str] | None) -> str | None:
    """The propagator's fields, as JSON text (leaseq writes them, never the caller)."""
    return None if not context else json.dumps(dict(context))
