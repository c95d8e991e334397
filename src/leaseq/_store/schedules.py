"""Operations of periodic jobs: declare schedules, take a due one, fire its ticks,
record what was done, list and remove them (see :mod:`leaseq._worker.scheduler`)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from .. import _validate_operators as operator_input
from .._statement import Operation, Rows, Statement
from .._types import ScheduleInfo
from .base import StoreBase, ignore


class ScheduleOperations(StoreBase):
    def register_schedules(
        self, schedules: Sequence[tuple[str, str, str, str, datetime]]
    ) -> Operation[None]:
        """Declare (name, queue, spec, tz, first tick) of each schedule."""
        params = {
            "names": [s[0] for s in schedules],
            "queues": [s[1] for s in schedules],
            "specs": [s[2] for s in schedules],
            "tzs": [s[3] for s in schedules],
            "first_ticks": [s[4] for s in schedules],
        }
        return Operation((Statement(self.sql("schedule_register.sql"), params),), ignore)

    def clock_now(self) -> Operation[datetime]:
        """The database's time, by the schema's clock (ticks are computed on it)."""
        return Operation((Statement(self.sql("clock_now.sql")),), lambda r: r[0][0][0])

    def due_schedules(self, names: Sequence[str]) -> Operation[list[str]]:
        return Operation(
            (Statement(self.sql("schedule_due.sql"), {"names": list(names)}),),
            lambda r: [row[0] for row in r[0]],
        )

    def lock_schedule(
        self, name: str, *, queue: str, spec: str, tz: str
    ) -> Operation[tuple[datetime, datetime, bool] | None]:
        """(next tick, the database's now, queue paused) if due, not taken and
        declared as given (queue, spec, time zone), locked until the transaction
        ends; else None."""

        def decode(rows: list[Rows]) -> tuple[datetime, datetime, bool] | None:
            if not rows[0]:
                return None
            next_tick, now, paused = rows[0][0]
            return next_tick, now, bool(paused)

        params = {"name": name, "queue": queue, "spec": spec, "tz": tz}
        return Operation((Statement(self.sql("schedule_lock.sql"), params),), decode)

    def fire_tick(
        self,
        name: str,
        tick: datetime,
        *,
        queue: str,
        payload_text: str,
        payload_bytes: int,
        priority: int,
        max_attempts: int | None,
        idempotency_key: str,
    ) -> Operation[int | None]:
        """Enqueue the job of one tick: its id, or None if the tick already had one."""
        params: dict[str, Any] = {
            "name": name,
            "tick_at": tick,
            "channel": self._notify_channel,
            "queue": queue,
            "payload": payload_text,
            "payload_bytes": payload_bytes,
            "priority": priority,
            "max_attempts": max_attempts,
            "idempotency_key": idempotency_key,
        }
        return Operation(
            (Statement(self.sql("schedule_fire.sql"), params),),
            lambda r: r[0][0][0] if r[0] else None,
        )

    def advance_schedule(
        self,
        name: str,
        *,
        last_tick: datetime,
        next_tick: datetime,
        enqueued: int,
        skipped: int,
        paused: int,
        last_job_id: int | None,
    ) -> Operation[None]:
        params = {
            "name": name,
            "last_tick": last_tick,
            "next_tick": next_tick,
            "enqueued": enqueued,
            "skipped": skipped,
            "paused": paused,
            "last_job_id": last_job_id,
        }
        return Operation((Statement(self.sql("schedule_advance.sql"), params),), ignore)

    def remove_schedule(self, name: str, *, actor: str | None) -> Operation[bool]:
        """Remove a schedule's row and ticks, audited: whether there was one."""
        params = {"name": operator_input.schedule_name(name), "actor": operator_input.actor(actor)}
        return Operation(
            (Statement(self.sql("schedule_remove.sql"), params),), lambda r: bool(r[0][0][0])
        )

    def schedules(self) -> Operation[list[ScheduleInfo]]:
        def decode(rows: list[Rows]) -> list[ScheduleInfo]:
            return [
                ScheduleInfo(
                    name=r[0],
                    queue=r[1],
                    spec=r[2],
                    tz=r[3],
                    last_tick=r[4],
                    next_tick=r[5],
                    enqueued=r[6],
                    skipped=r[7],
                    paused_ticks=r[8],
                    last_job_id=r[9],
                    queue_paused=bool(r[10]),
                    overdue_seconds=float(r[11]),
                )
                for r in rows[0]
            ]

        return Operation((Statement(self.sql("schedules.sql")),), decode)
