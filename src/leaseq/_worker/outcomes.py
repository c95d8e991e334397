"""Batched acknowledgements: completions, retries, failures and releases.

Handlers finish one by one; their outcomes are flushed together, one statement
per kind per flush, each still fenced and reported per job. Each kind has one
entry in :data:`WRITES`: the client's batch method, and how its per-claim answer
reads as an :class:`Answer`, which is what the database did (a retry of a job
with no attempts left comes back FAILED: the database failed it).

A flush that hits a connection error is retried: every acknowledgement is safe
to resend (a resend of a committed write is reported as accepted). A batch
refused for any other reason wrote nothing; its outcomes are then sent one by
one, so one that cannot be sent fails alone, on its own job's report.
"""

from __future__ import annotations

import asyncio
import enum
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from .._async_client import AsyncQueue
from .._errors import JobNotFound, LeaseqError, TransientError
from .._logs import get_logger
from .._types import Claim, JobStatus
from .._validate_payloads import EncodedPayload
from .._waiting import pause, wait_for_event
from .outage import Outage

log = get_logger("leaseq.worker")

#: How long a stopping worker waits for its last acknowledgements (the releases,
#: then whatever is still unflushed) when the database does not take them; then
#: it leaves them to their leases' expiry, as a crash would.
ACKNOWLEDGEMENT_WAIT = 10.0


class Kind(enum.Enum):
    """What the worker asks the database to do with a claim."""

    COMPLETE = "complete"
    RETRY = "retry"
    FAIL = "fail"
    RELEASE = "release"


class Answer(enum.Enum):
    """What the database did with one acknowledgement."""

    COMPLETED = "completed"
    RETRIED = "retried"  # queued again for another attempt
    FAILED = "failed"  # a fail, or a retry of a job with no attempts left
    RELEASED = "released"
    LOST = "lost"  # this claim no longer owned the job: nothing was written
    #: Resent after a connection error, and the job no longer exists: retention
    #: deleted it (it had finished). Nothing was written; whether the first send
    #: committed (most likely) or the lease was lost meanwhile, nothing left says.
    GONE = "gone"


@dataclass(frozen=True, slots=True)
class Outcome:
    """How one attempt ended, to be acknowledged: ``delay`` and ``error`` as the kind takes."""

    kind: Kind
    claim: Claim
    delay: float | None = None  # RETRY: None for the queue's backoff
    error: object = None  # RETRY and FAIL: recorded as the job's last error
    result: EncodedPayload | None = None  # COMPLETE: the handler's return value, encoded
    handler_running: bool = False  # RELEASE: its thread runs on (the job waits for its lease)


@dataclass(frozen=True, slots=True)
class Write:
    """How outcomes of one kind are written: one batch call, then one answer per claim."""

    send: Callable[[AsyncQueue, Sequence[Outcome]], Awaitable[Sequence[tuple[Claim, Any]]]]
    answer: Callable[[Any], Answer]


def _accepted_as(answer: Answer) -> Callable[[Any], Answer]:
    """The answer of a batch method that says True (written) or False (lost) per claim."""
    return lambda accepted: answer if accepted else Answer.LOST


def _retry_answer(status: JobStatus | None) -> Answer:
    if status is None:
        return Answer.LOST
    return Answer.FAILED if status is JobStatus.FAILED else Answer.RETRIED


def _claims(group: Sequence[Outcome]) -> list[Claim]:
    return [o.claim for o in group]


#: Every kind's write, in the order a flush sends them.
WRITES: dict[Kind, Write] = {
    Kind.COMPLETE: Write(
        lambda queue, group: queue.complete_many(_claims(group), results=[o.result for o in group]),
        _accepted_as(Answer.COMPLETED),
    ),
    Kind.RETRY: Write(
        lambda queue, group: queue.retry_many(
            _claims(group), delays=[o.delay for o in group], errors=[o.error for o in group]
        ),
        _retry_answer,
    ),
    Kind.FAIL: Write(
        lambda queue, group: queue.fail_many(_claims(group), [o.error for o in group]),
        _accepted_as(Answer.FAILED),
    ),
    Kind.RELEASE: Write(
        lambda queue, group: queue.release_many(
            _claims(group), handlers_running=[o.handler_running for o in group]
        ),
        _accepted_as(Answer.RELEASED),
    ),
}


@dataclass(frozen=True, slots=True)
class _Pending:
    outcome: Outcome
    answered: asyncio.Future[Answer]


class Outcomes:
    """Collects outcomes and flushes them in batches."""

    def __init__(
        self, queue: AsyncQueue, *, max_batch: int = 500, outage: Outage | None = None
    ) -> None:
        self._queue = queue
        self._outage = outage or Outage()
        # A deque and an event, not an asyncio.Queue: one append and one set per
        # outcome, no getter futures to wake per item.
        self._pending: deque[_Pending] = deque()
        self._arrived = asyncio.Event()
        self._max_batch = max_batch
        self._closed = False

    async def report(self, outcome: Outcome) -> Answer:
        """Queue an outcome and wait for its flush: what the database did with it.

        Raises what prevented this outcome (and only this one) from being sent, and
        RuntimeError once the worker has stopped (nobody would ever flush it).
        """
        if self._closed:
            raise RuntimeError("the worker has stopped: this outcome is not sent (lease expiry)")
        pending = _Pending(outcome, asyncio.get_running_loop().create_future())
        self._pending.append(pending)
        self._arrived.set()
        return await pending.answered

    async def run(self) -> None:
        pending = self._pending
        while True:
            while not pending:
                await wait_for_event(self._arrived, None)
            # No linger: a flush starts at once and whatever finishes while it is
            # in flight joins the next one, so batches grow with the load and a
            # lone outcome waits for nothing (a 2 ms linger held every job at
            # concurrency 1 for 2 ms). The yield lets the handlers that are
            # already done this turn of the loop join this flush.
            await asyncio.sleep(0)
            batch = [pending.popleft() for _ in range(min(len(pending), self._max_batch))]
            await self._flush(batch)

    async def drain(self) -> None:
        """Flush whatever is pending (at shutdown, after run() was cancelled); what
        is reported after that raises (a handler that ignored its cancellation and
        returned late would otherwise wait for a flush for ever)."""
        self._closed = True
        batch = list(self._pending)
        self._pending.clear()
        if batch:
            await self._flush(batch)

    async def _flush(self, batch: list[_Pending]) -> None:
        for kind, write in WRITES.items():
            group = [p for p in batch if p.outcome.kind is kind]
            if group:
                await self._flush_group(kind, write, group)

    async def _flush_group(self, kind: Kind, write: Write, group: list[_Pending]) -> None:
        try:
            results, resent = await self._send_until_delivered(kind, write, group)
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
            for pending in group:
                await self._flush_group(kind, write, [pending])
            return
        answers = [write.answer(value) for _, value in results]
        if resent and Answer.LOST in answers:
            answers = await self._gone_or_lost(group, answers)
        for pending, answer in zip(group, answers, strict=True):
            _settle(pending, answer)

    async def _gone_or_lost(self, group: list[_Pending], answers: list[Answer]) -> list[Answer]:
        """After a resend, a "lost" whose job no longer exists is GONE: retention
        (in delete mode; the archive answers the resend itself) removed the job
        between the first send's commit and the resend, or after the lease was
        lost; a lost lease is not what to report when nothing says which."""
        said = list(answers)
        for i, pending in enumerate(group):
            if said[i] is not Answer.LOST:
                continue
            try:
                await self._queue.get(pending.outcome.claim.job_id)
            except JobNotFound:
                said[i] = Answer.GONE
            except LeaseqError:  # cannot tell now: the refusal stands as it was
                pass
        return said

    async def _send_until_delivered(
        self, kind: Kind, write: Write, group: list[_Pending]
    ) -> tuple[Sequence[tuple[Claim, Any]], bool]:
        """Send, retrying connection errors (resending a committed write is accepted);
        also say whether it was resent."""
        outcomes = [p.outcome for p in group]
        delay = 0.05
        resent = False
        while True:
            try:
                sent = await write.send(self._queue, outcomes)
            except TransientError as exc:
                resent = True
                self._outage.failed(f"acknowledgements ({len(group)} {kind.value})", exc)
                await pause(delay)
                delay = min(delay * 2, 2.0)
                continue
            self._outage.answered()
            return sent, resent


def _settle(pending: _Pending, result: Answer | BaseException) -> None:
    if pending.answered.done():  # its reporter gave up waiting (cancelled)
        return
    if isinstance(result, BaseException):
        pending.answered.set_exception(result)
    else:
        pending.answered.set_result(result)
