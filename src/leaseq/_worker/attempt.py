"""One attempt of one job: its handler run to an :class:`~.outcomes.Outcome`, then acknowledged.

:meth:`AttemptRunner.outcome_of` runs the handler under its task's timeout
(:mod:`.handlers`) and says how the attempt ended:

* it returned: COMPLETE with what it returned as the job's result (FAIL with
  InvalidResult if that is not JSON or over its task's ``max_result_bytes``),
  unless its ``job.transaction()`` already completed the job;
* it asked for a retry (:class:`~leaseq.Retry`), raised an error its task's
  ErrorPolicy retries (a ``TimeoutError`` of its own included), or ran past its
  timeout (the job's own, else its task's): RETRY, or FAIL when its task allows
  no more attempts;
* it raised an error the policy fails (``PermanentError``, ``fail_on``, not in
  ``retry_on``): FAIL;
* it was cancelled at shutdown: RELEASE;
* nothing to acknowledge (None): its lease was lost (``LeaseLost`` of its own
  claim: one of another claim the handler wrote with is its error; or the
  attempt was lost meanwhile), or its transaction completed the job before it
  timed out or raised.

The outcome is then reported to :class:`~.outcomes.Outcomes` and counted as
what the database did with it; an outcome the database refuses (the lease is
no longer held) loses the attempt.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from .. import _tracing
from .. import _validate_payloads as payload_checks
from .._errors import InvalidResult, LeaseLost
from .._logs import error_repr, get_logger, job_fields
from .._metrics import Metrics
from .._payload_masking import PayloadFree
from .._retry import Retry, Verdict
from .._types import Claim
from .._waiting import cancelling
from .app import Task
from .context import JobContext
from .handlers import TimedOut, run_in_thread, run_on_loop, run_until
from .hooks import Hooks
from .outcomes import Answer, Kind, Outcome, Outcomes
from .processes import ProcessPool
from .registry import AttemptRegistry
from .state import Attempt, WorkerStats
from .threads import DaemonThreads

log = get_logger("leaseq.worker")


class AttemptRunner:
    """Runs each claimed attempt in a task of its own, from its handler to its acknowledgement."""

    def __init__(
        self,
        attempts: AttemptRegistry,
        outcomes: Outcomes,
        stats: WorkerStats,
        metrics: Metrics | None,
        *,
        slots: int,
        made_work: Callable[[str], None],
        hooks: Hooks | None = None,
        processes: ProcessPool | None = None,
    ) -> None:
        self._hooks = hooks or Hooks()
        self._processes = processes  # for handlers with executor="process"
        self._attempts = attempts
        self._made_work = made_work
        self._outcomes = outcomes
        self._stats = stats
        self._metrics = metrics
        self._threads = DaemonThreads(slots, "leaseq-job")  # sync handlers: one per slot
        # The app's plain after-hooks: threads of their own, so that one still
        # running past its wait keeps no handler from a thread.
        self._hook_threads = DaemonThreads(slots, "leaseq-hook")

    def start(self, attempt: Attempt, task: Task, *, traced: bool | None = None) -> None:
        """Run the attempt in a task of its own; ``traced``: what ``_tracing.active()``
        said for its claim (None: ask for this attempt)."""
        attempt.task = asyncio.create_task(self._run(attempt, task, traced))

    def close(self) -> None:
        """Let the threads end once free; never waits (one still running ends with the
        process); stop the handlers' child processes."""
        self._threads.shutdown()
        self._hook_threads.shutdown()
        if self._processes is not None:
            self._processes.close()

    async def _run(self, attempt: Attempt, task: Task, traced: bool | None) -> None:
        claim = attempt.claim
        attempt.hooks_pending = self._hooks.after_outcomes
        instruments = None if self._metrics is None else self._metrics.queue(claim.queue)
        label = LOST_HERE
        try:
            with _tracing.process(claim, claim.trace_context, active=traced) as span:
                if log.isEnabledFor(logging.DEBUG):  # its fields are built per job
                    log.debug(
                        "job %d (%s) attempt %d started",
                        claim.job_id,
                        claim.queue,
                        claim.attempts,
                        extra=job_fields(claim, task=claim.queue),
                    )
                started = time.perf_counter()
                outcome = await self.outcome_of(attempt, task)
                if attempt.stopping and outcome is not None and outcome.kind is not Kind.RELEASE:
                    # It returned (or raised) because the worker's stop told it to:
                    # not its result. Its thread has ended: claimable at once. (A
                    # release already says whether its thread runs on: left as is.)
                    outcome = Outcome(Kind.RELEASE, claim)
                elapsed = time.perf_counter() - started
                if instruments is not None:
                    instruments.job_duration.observe(elapsed)
                label = await self._acknowledge(attempt, outcome)
                attempt.settled = True
                # Counted, logged and its span ended as soon as the database has
                # recorded it: hooks may run long, or be cut at a stop.
                if instruments is not None and label in FINISHED:
                    instruments.finished[label].inc()
                error = None if outcome is None else outcome.error
                span.ended(label, _exception(error), _description(label, error))
                _log_finished(claim, label, elapsed, outcome)
                if self._hooks.after_outcomes:
                    await self._hooks.after(
                        attempt.context,
                        label,
                        attempt.context.outcome_result,
                        error,
                        threads=self._hook_threads,
                        timeout=task.timeout_of(claim),
                    )
        except Exception:
            log.exception(
                "job %d: could not record its outcome", claim.job_id, extra=job_fields(claim)
            )
        finally:
            self._attempts.finish(attempt)
            # What may have made a job of this queue claimable: a keyed job's
            # end (its successor), a retry, a release, a lost lease (.hints).
            if claim.key is not None or label not in ("done", "failed"):
                self._made_work(claim.queue)

    async def _acknowledge(self, attempt: Attempt, outcome: Outcome | None) -> str:
        """Report the outcome; say what the database did with it (a metrics label)."""
        if attempt.lost:
            outcome = None  # never acknowledge the result of a lost lease
        if outcome is not None:
            self._attempts.handler_returned(attempt)
            answer = await self._outcomes.report(outcome)
            if answer in (Answer.LOST, Answer.GONE):  # GONE: never a success unvouched for
                reason = f"{outcome.kind.value} {REFUSED[answer]}"
                self._attempts.lose(attempt, reason)  # counted there, as lease_lost
                return LOST_HERE
            _count(self._stats, answer)
            return OUTCOME_OF[answer]
        if attempt.context.completed:
            self._stats.completed += 1
            return "done"
        if not attempt.lost:  # its own transaction's completion was refused (LeaseLost)
            self._attempts.lose(
                attempt, "its completion was refused: lease no longer held", returned=True
            )
        return LOST_HERE  # counted where the attempt was lost

    async def outcome_of(self, attempt: Attempt, task: Task) -> Outcome | None:
        """Run the handler; say how to acknowledge it (None: nothing to acknowledge)."""
        context, claim = attempt.context, attempt.claim
        limit = task.attempt_limit(claim.max_attempts)
        if claim.attempts > limit:
            # Past its task's budget: the workers of its last attempts died with it
            # (each recovered claim counts an attempt). The database fails a job
            # only past its own max_attempts; a crash loop must stop at the task's.
            return Outcome(
                Kind.FAIL,
                claim,
                error=WorkerError(
                    f"no attempts left: attempt {claim.attempts} of {limit} "
                    "(the earlier ones ended with their worker)"
                ),
            )
        timeout = task.timeout_of(claim)
        try:
            returned = await self._call(task, context, timeout, attempt)
        except TimedOut:
            if context.completed:  # its transaction committed before the timeout
                return None
            return _retry_or_fail(task, claim, None, WorkerError(f"timed out after {timeout:g}s"))
        except Retry as request:
            if context.completed:  # its transaction completed the job: done, as said
                return _raised(task, context, request)
            return _retry_or_fail(task, claim, request.delay, request.reason)
        except LeaseLost as exc:
            if (exc.job_id, exc.lease_version) == (claim.job_id, claim.lease_version):
                if attempt.stopping and not attempt.lost and not context.completed:
                    # The stop told it (job.lost), so its job.transaction() refused
                    # to complete and rolled back: its lease is still the worker's,
                    # and it has returned. Released, claimable at once (a lease
                    # lost meanwhile refuses the release, which says so).
                    return Outcome(Kind.RELEASE, claim)
                return None  # its own claim's fenced write was refused: its lease is gone
            # A fenced write of another claim (the handler's own use of a queue):
            # the handler's error, as any other; its own lease still holds.
            return _raised(task, context, exc)
        except asyncio.CancelledError as exc:
            if attempt.lost:
                return None
            if self._attempts.releasing:
                if context.completed:  # its transaction completed the job: done, nothing to give
                    return None
                # A sync handler's thread runs on until it sees job.lost: its job
                # must not start elsewhere before its lease would have ended.
                return Outcome(Kind.RELEASE, claim, handler_running=not attempt.cancellable)
            if cancelling():
                raise  # this attempt's task was cancelled: not the handler's outcome
            # the handler's own CancelledError (it awaited something cancelled)
            return _raised(task, context, exc)
        except BaseException as exc:  # every error of a handler is its outcome
            # An Exception (a TimeoutError the handler raised itself included), and
            # what is not one: a SystemExit (argparse's parser.error), a
            # KeyboardInterrupt, a BaseException of its own. Left to propagate, those
            # stopped the event loop, the whole worker with it, its claims running.
            return _raised(task, context, exc)
        if context.completed:
            if returned is not None:  # its transaction's completion committed without it
                log.warning(
                    "job %d: a handler that completes through job.transaction() returned "
                    "a value; it is not stored (set job.result inside the block instead)",
                    claim.job_id,
                    extra=job_fields(claim),
                )
            return None
        context.result = returned  # what the on_success hooks see
        try:
            result = payload_checks.result(returned, task.max_result_bytes)
        except InvalidResult as exc:
            return Outcome(Kind.FAIL, claim, error=exc)
        return Outcome(Kind.COMPLETE, claim, result=result)

    async def _call(
        self, task: Task, context: JobContext, timeout: float | None, attempt: Attempt
    ) -> Any:
        """The handler's return value: under its timeout, inside the app's hooks if any."""
        hooks = self._hooks
        if task.is_async and timeout is None and not hooks.wrap_handlers:
            return await task.handler(context)  # the common case, without wrappers
        timed_out = functools.partial(self._timed_out, attempt)
        if task.is_async:
            if hooks.wrap_handlers:
                return await run_on_loop(
                    lambda: hooks.call_async(task.handler, context), timeout, timed_out
                )
            return await run_on_loop(lambda: task.handler(context), timeout, timed_out)

        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout

        def in_thread(function: Callable[[JobContext], Any]) -> Awaitable[Any]:
            if attempt.lost:  # while the app's async hooks before it ran: never started
                raise LeaseLost(context.job_id, context.lease_version, "the handler's start")
            left = None if deadline is None else max(deadline - loop.time(), 0.0)
            return run_in_thread(self._threads, function, context, left, timed_out)

        def in_time(awaitable: Awaitable[Any]) -> Awaitable[Any]:
            # The app's async hooks around the thread count against the job's time,
            # as they do around an async handler: a hung one cannot hold the slot.
            return run_until(awaitable, deadline, timed_out)

        handler = task.handler
        if task.executor == "process":
            assert self._processes is not None  # the worker makes one for such apps
            handler = functools.partial(self._processes.call, task.handler)
        if hooks.wrap_handlers:
            return await hooks.call_in_thread(handler, context, in_thread, in_time)
        return await in_thread(handler)

    def _timed_out(self, attempt: Attempt) -> None:
        self._stats.timeouts += 1
        attempt.context.mark_lost("timed out")  # job.transaction() now refuses


def _raised(task: Task, context: JobContext, exc: BaseException) -> Outcome | None:
    """The outcome of a handler that raised ``exc``: its task's ErrorPolicy says."""
    claim = context.claim
    if context.completed:  # the job's transaction already completed it
        error = error_repr(exc, claim.payload)
        log.warning(
            "job %d raised after completing: %s",
            claim.job_id,
            error,
            extra=job_fields(claim, error=error),
        )
        return None
    if task.errors.classify(exc) is Verdict.FAIL:
        return Outcome(Kind.FAIL, claim, error=exc)
    return _retry_or_fail(task, claim, None, exc)


def _retry_or_fail(task: Task, claim: Claim, delay: float | None, error: object) -> Outcome:
    """RETRY while the task allows another attempt, else FAIL.

    The database has the last word: a retry of a job with no attempts left (by
    the job's own row) fails it, and its answer says so.
    """
    if not task.attempts_left(claim.attempts, claim.max_attempts):
        return Outcome(Kind.FAIL, claim, error=error)
    if delay is None:
        delay = task.retry_delay(claim.attempts)
    return Outcome(Kind.RETRY, claim, delay=delay, error=error)


def _exception(error: object) -> BaseException | None:
    return error if isinstance(error, BaseException) else None


class WorkerError(PayloadFree):
    """The worker's own account of a failed attempt that raised nothing (a timeout,
    no attempts left): a text, as the job's last error and the on_failure hooks
    take it, but an error, where the reason of a requested retry is not. It quotes
    no payload: none of its words is masked as a payload value."""


def _description(label: str, error: object) -> str | None:
    """An error without an exception, for the attempt's span: a WorkerError, the
    reason of a retry requested with no attempt left (the job failed), or the lost
    lease of an attempt that raised nothing (nothing it did was kept: no success)."""
    if label == LOST_HERE and not isinstance(error, BaseException):
        return LEASE_LOST
    if error is None or isinstance(error, BaseException):
        return None
    if isinstance(error, WorkerError):
        return error  # as it is: a PayloadFree text
    if label == "failed":
        return str(error)
    return None


def _log_finished(claim: Claim, label: str, elapsed: float, outcome: Outcome | None) -> None:
    """A line per finished attempt: DEBUG when done, INFO when it will run again
    or failed for good (with its error), nothing for a lost lease (said when lost)."""
    if label == LOST_HERE:
        return
    level = logging.DEBUG if label in ("done", "released") else logging.INFO
    if not log.isEnabledFor(level):
        return
    error = (
        None
        if outcome is None or outcome.error is None
        else error_repr(outcome.error, claim.payload)
    )
    fields = job_fields(
        claim, task=claim.queue, outcome=label, duration_seconds=round(elapsed, 6), error=error
    )
    log.log(
        level,
        "job %d (%s) attempt %d %s in %.3fs%s",
        claim.job_id,
        claim.queue,
        claim.attempts,
        label,
        elapsed,
        f": {error}" if error else "",
        extra=fields,
    )


#: What _acknowledge says when the attempt was lost: leaseq_jobs_finished_total's
#: lease_lost is counted where the attempt is lost (AttemptRegistry.lose), not here.
#: The same word as that label and the log's ``outcome``: the span's leaseq.outcome.
LOST_HERE = "lease_lost"
#: The status description of an attempt's span when its lease was lost.
LEASE_LOST = WorkerError("lease lost: the attempt's result was not acknowledged")

#: The ``outcome`` label of leaseq_jobs_finished_total for each answer of the database
#: (a lost one is counted where the attempt is lost, AttemptRegistry.lose).
OUTCOME_OF = {
    Answer.COMPLETED: "done",
    Answer.RETRIED: "retried",
    Answer.FAILED: "failed",
    Answer.RELEASED: "released",
    Answer.LOST: "lease_lost",
    Answer.GONE: "lease_lost",
}
#: The labels counted here, once per attempt.
FINISHED = frozenset(label for answer, label in OUTCOME_OF.items() if label != LOST_HERE)
#: Why an acknowledgement the database did not take loses its attempt.
REFUSED = {
    Answer.LOST: "refused: lease no longer held",
    Answer.GONE: "not confirmed: retention deleted the job before a resend after a "
    "connection error was answered (its first send most likely committed)",
}


def _count(stats: WorkerStats, answer: Answer) -> None:
    """Count an acknowledgement as what the database did with it (not what was asked)."""
    match answer:
        case Answer.COMPLETED:
            stats.completed += 1
        case Answer.RETRIED:
            stats.retried += 1
        case Answer.FAILED:
            stats.failed += 1
        case Answer.RELEASED:
            stats.released += 1
        case Answer.LOST | Answer.GONE:
            pass  # counted where the attempt is lost (AttemptRegistry.lose)
