"""Batched acknowledgements: completions, retries, failures and releases.

Handlers finish one by one; their outcomes are flushed together, one statement
per kind per flush, each still fenced and reported per job. A flush that hits
a connection error is retried: complete, retry and release are safe to repeat
(a resend of a committed write is reported as accepted). A batch refused for
any other reason wrote nothing; its outcomes are then sent one by one, so one
that cannot be sent fails alone, on its own job's report.
"""

from __future__ import annotations

import asyncio
import enum
from dataclasses import dataclass, field
from typing import Any

from .._async_client import AsyncQueue
from .._errors import TransientError
from .._logs import get_logger
from .._types import Claim

log = get_logger("leaseq.worker")


class Kind(enum.Enum):
    COMPLETE = "complete"
    RETRY = "retry"
    FAIL = "fail"
    RELEASE = "release"


@dataclass(slots=True)
class Outcome:
    kind: Kind
    claim: Claim
    delay: float | None = None
    error: object = None
    accepted: asyncio.Future[bool] = field(default_factory=asyncio.Future)


class Outcomes:
    """Collects outcomes and flushes them in batches."""

    def __init__(self, queue: AsyncQueue, *, max_batch: int = 500, linger: float = 0.002) -> None:
        self._queue = queue
        self._pending: asyncio.Queue[Outcome] = asyncio.Queue()
        self._max_batch = max_batch
        self._linger = linger

    async def report(
        self, kind: Kind, claim: Claim, *, delay: float | None = None, error: object = None
    ) -> bool:
        """Queue an outcome and wait for its flush: True if accepted, False if lease was lost.

        Raises what prevented this outcome (and only this one) from being sent.
        """
        outcome = Outcome(kind, claim, delay, error)
        self._pending.put_nowait(outcome)
        return await outcome.accepted

    async def run(self) -> None:
        while True:
            batch = [await self._pending.get()]
            if self._linger:
                await asyncio.sleep(self._linger)  # let concurrent finishes join the flush
            while len(batch) < self._max_batch and not self._pending.empty():
                batch.append(self._pending.get_nowait())
            await self._flush(batch)

    async def drain(self) -> None:
        """Flush whatever is pending (at shutdown, after run() was cancelled)."""
        batch: list[Outcome] = []
        while not self._pending.empty():
            batch.append(self._pending.get_nowait())
        if batch:
            await self._flush(batch)

    async def _flush(self, batch: list[Outcome]) -> None:
        for kind in Kind:
            group = [o for o in batch if o.kind is kind]
            if group:
                await self._flush_kind(kind, group)

    async def _flush_kind(self, kind: Kind, group: list[Outcome]) -> None:
        try:
            results = await self._send_until_delivered(kind, group)
        except Exception as exc:
            if len(group) == 1:
                _settle(group[0], exc)
                return
            # Something in the batch cannot be sent (a value the statement refuses, and
            # a refused statement writes nothing): send each on its own, so only the
            # poisoned outcomes fail, on their own jobs.
            log.warning(
                "a batch of %d %s outcomes was refused (%s); sending them one by one",
                len(group),
                kind.value,
                exc,
            )
            for outcome in group:
                await self._flush_kind(kind, [outcome])
            return
        for outcome, accepted in zip(group, results, strict=True):
            _settle(outcome, accepted)

    async def _send_until_delivered(self, kind: Kind, group: list[Outcome]) -> list[bool]:
        """Send, retrying connection errors (resending a committed write is accepted)."""
        delay = 0.05
        while True:
            try:
                return await self._send(kind, group)
            except Exception as exc:
                if not isinstance(exc, TransientError):
                    raise
                log.warning(
                    "flushing %d %s outcomes failed (%s); retrying", len(group), kind.value, exc
                )
                await asyncio.sleep(delay)
                delay = min(delay * 2, 2.0)

    async def _send(self, kind: Kind, group: list[Outcome]) -> list[bool]:
        claims = [o.claim for o in group]
        result: list[tuple[Claim, Any]]
        if kind is Kind.COMPLETE:
            result = await self._queue.complete_many(claims)
        elif kind is Kind.RETRY:
            result = await self._queue.retry_many(
                claims, delays=[o.delay for o in group], errors=[o.error for o in group]
            )
        elif kind is Kind.FAIL:
            result = await self._queue.fail_many(claims, [o.error for o in group])
        else:
            result = await self._queue.release_many(claims)
        return [value is not None and value is not False for _, value in result]


def _settle(outcome: Outcome, result: bool | BaseException) -> None:
    if outcome.accepted.done():  # its reporter gave up waiting (cancelled)
        return
    if isinstance(result, BaseException):
        outcome.accepted.set_exception(result)
    else:
        outcome.accepted.set_result(result)
