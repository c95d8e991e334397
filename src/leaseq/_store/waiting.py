"""Operations of the wake-up entries (migration 0020): a worker that waits for
notifications on a queue says so in the queue's row, so that enqueues notify
only then (see :mod:`leaseq._worker.wake_entries`)."""

from __future__ import annotations

from collections.abc import Sequence

from .._statement import Operation, Statement
from .base import StoreBase, ignore


class WaitingOperations(StoreBase):
    def waiter_enter(self, queues: Sequence[str], worker: str, seconds: float) -> Operation[None]:
        """Enter (or move on) ``worker``'s entries of ``queues``, expiring in ``seconds``."""
        params = {"queues": list(queues), "worker": worker, "seconds": seconds}
        return Operation((Statement(self.sql("waiter_enter.sql"), params),), ignore)

    def waiter_fence(self) -> Operation[int]:
        """A transaction id given after every one given before this call."""
        return Operation((Statement(self.sql("waiter_fence.sql")),), lambda r: int(r[0][0][0]))

    def waiter_settled(self, fence: int) -> Operation[bool]:
        """Whether every transaction given an id below ``fence`` has ended."""
        return Operation(
            (Statement(self.sql("waiter_settled.sql"), {"fence": str(fence)}),),
            lambda r: bool(r[0][0][0]),
        )

    def waiter_refresh(
        self, queues: Sequence[str], worker: str, seconds: float
    ) -> Operation[set[str]]:
        """Move ``worker``'s entries in ``queues`` on; those it still has an entry in."""
        params = {"queues": list(queues), "worker": worker, "seconds": seconds}
        return Operation(
            (Statement(self.sql("waiter_refresh.sql"), params),),
            lambda r: {row[0] for row in r[0]},
        )

    def waiter_leave(self, queues: Sequence[str], worker: str) -> Operation[None]:
        """Remove ``worker``'s entries of ``queues``."""
        params = {"queues": list(queues), "worker": worker}
        return Operation((Statement(self.sql("waiter_leave.sql"), params),), ignore)
