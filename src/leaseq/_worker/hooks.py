"""The app's hooks around every job: before it, around its handler, after its outcome.

For logging, metrics, tracing and error reporting. A hook can never change or
lose a job's outcome: an exception it raises is logged and the job goes on (a
``before`` hook that fails does not stop the handler; an ``around`` context
manager that fails to enter is left out; what its exit returns is ignored, so
it cannot swallow the handler's exception), and the ``after`` hooks see what
the database did with the outcome, once it did it.

Where they run:

* ``before_job`` and ``around_job`` run where the handler runs: a sync hook in
  the handler's thread (for a plain ``def`` handler) or on the event loop (for
  an ``async def`` one); an ``async def`` hook, or an async context manager, is
  awaited on the event loop in both cases (for a plain handler: before its
  thread starts, and around it). They count against the job's timeout: a hook
  that hangs times the attempt out. Once the job timed out or was cancelled, an
  async context manager still gets EXIT_GRACE_SECONDS to exit, then is
  cancelled: a hung exit cannot hold the job's slot and lease for ever (a sync
  one, in the handler's thread, holds them as long as that thread runs);
* ``on_success(job, result)`` and ``on_failure(job, error, will_retry)`` run
  after the outcome was acknowledged: async hooks on the loop, plain ones in a
  thread of their own, so that a slow one never holds up the loop. Each is
  waited for as long as its job may run (its timeout), no longer: one that
  hangs cannot keep the job's slot taken (an async one is cancelled, a plain
  one's thread left to end on its own).
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager, AbstractContextManager
from dataclasses import dataclass, field
from typing import Any, TypeAlias

from .._logs import get_logger, job_fields
from .._waiting import cancelling
from .context import JobContext
from .handlers import TimedOut
from .threads import DaemonThreads

log = get_logger("leaseq.worker")

#: How long an async ``around_job`` context manager may take to exit once its
#: job's deadline is gone (the job timed out, or the worker cancelled it at
#: shutdown). Enough to end a span or flush a report; then it is cancelled.
EXIT_GRACE_SECONDS = 5.0

BeforeHook: TypeAlias = Callable[[JobContext], Any]
AroundHook: TypeAlias = Callable[
    [JobContext], AbstractContextManager[Any] | AbstractAsyncContextManager[Any]
]
SuccessHook: TypeAlias = Callable[[JobContext, Any], Any]
#: ``error`` is the exception the handler raised, or a description (a timeout);
#: ``will_retry`` says whether the job will run again.
FailureHook: TypeAlias = Callable[[JobContext, Any, bool], Any]

Entered: TypeAlias = list[AbstractContextManager[Any] | AbstractAsyncContextManager[Any]]


@dataclass
class Hooks:
    before: list[BeforeHook] = field(default_factory=list)
    around: list[AroundHook] = field(default_factory=list)
    success: list[SuccessHook] = field(default_factory=list)
    failure: list[FailureHook] = field(default_factory=list)

    @property
    def wrap_handlers(self) -> bool:
        return bool(self.before or self.around)

    @property
    def after_outcomes(self) -> bool:
        return bool(self.success or self.failure)

    # -- around the handler ------------------------------------------------------

    async def call_async(self, handler: Callable[[JobContext], Any], job: JobContext) -> Any:
        """Await an ``async def`` handler inside the hooks (all on the loop)."""
        for hook in self.before:
            await _call_before(hook, job)
        entered = await _enter_all(self._managers(job), _enter, job)
        try:
            returned = await handler(job)
        except BaseException as exc:
            await _exit_all(entered, exc, job)
            raise
        await _exit_all(entered, None, job)
        return returned

    async def call_in_thread(
        self,
        handler: Callable[[JobContext], Any],
        job: JobContext,
        run_in_thread: Callable[[Callable[[JobContext], Any]], Awaitable[Any]],
        in_time: Callable[[Awaitable[Any]], Awaitable[Any]],
    ) -> Any:
        """Run a plain handler in its thread (``run_in_thread``) inside the hooks:
        the sync ones in that thread, the async ones on the loop around it, awaited
        through ``in_time`` (the job's timeout)."""
        for hook in self.before:
            if is_async_callable(hook):
                await in_time(_call_before(hook, job))
        managers = self._managers(job)
        entered_here = await _enter_all(
            [cm for cm in managers if _is_async(cm)],
            lambda cm, context: in_time(_enter(cm, context)),
            job,
            in_time,
        )
        in_thread = [cm for cm in managers if not _is_async(cm)]
        sync_before = [hook for hook in self.before if not is_async_callable(hook)]

        def hooked(context: JobContext) -> Any:
            for hook in sync_before:
                _call_sync(hook, context)
            entered = [cm for cm in in_thread if _enter_sync(cm, context)]
            try:
                returned = handler(context)
            except BaseException as exc:
                _exit_all_sync(entered, exc, context)
                raise
            _exit_all_sync(entered, None, context)
            return returned

        try:
            returned = await run_in_thread(hooked)
        except BaseException as exc:
            exits = _exit_all(entered_here, exc, job)
            await (exits if _out_of_time(exc) else in_time(exits))
            raise
        await in_time(_exit_all(entered_here, None, job))
        return returned

    def _managers(self, job: JobContext) -> Entered:
        """Each around hook's context manager for this job (one that fails is left out)."""
        managers: Entered = []
        for hook in self.around:
            try:
                managers.append(hook(job))
            except BaseException as exc:
                _log_failure(hook, job, exc)
        return managers

    # -- after the outcome ---------------------------------------------------------

    async def after(
        self,
        job: JobContext,
        label: str,
        result: Any,
        error: Any,
        *,
        threads: DaemonThreads,
        timeout: float | None,
    ) -> None:
        """The outcome the database acknowledged: ``done``, ``retried`` or ``failed``;
        plain hooks run in ``threads``, each hook waited for ``timeout`` at most."""
        if label == "done":
            for success in self.success:
                await _call_after(success, job, (result,), threads, timeout)
        elif label in ("retried", "failed"):
            for failure in self.failure:
                await _call_after(failure, job, (error, label == "retried"), threads, timeout)


def is_async_callable(function: object) -> bool:
    """Whether calling ``function`` gives a coroutine to await: an ``async def``, a
    partial of one, or an object whose ``__call__`` is one (run as a plain call, its
    coroutine was never awaited: the handler or hook silently never ran)."""
    call = inspect.getattr_static(type(function), "__call__", None)
    return inspect.iscoroutinefunction(function) or inspect.iscoroutinefunction(call)


def _is_async(manager: object) -> bool:
    return hasattr(manager, "__aenter__")


async def _call_before(hook: BeforeHook, job: JobContext) -> None:
    """Call a before hook on the loop (awaited if async), logging what it raises."""
    try:
        if is_async_callable(hook):
            await hook(job)
        else:
            hook(job)
    except BaseException as exc:
        _log_failure(hook, job, exc)


async def _call_after(
    hook: Callable[..., Any],
    job: JobContext,
    args: tuple[Any, ...],
    threads: DaemonThreads,
    timeout: float | None,
) -> None:
    """Call an after hook, on the loop if async, else in one of ``threads``; wait
    ``timeout`` at most (past it, an async one is cancelled; a thread cannot be,
    and is left to end on its own); log what it raises."""
    scope = asyncio.timeout(timeout)
    try:
        async with scope:
            if is_async_callable(hook):
                await hook(job, *args)
            else:
                await threads.submit(lambda _: hook(job, *args), None)
    except TimeoutError:
        if not scope.expired():
            _log_failure(hook, job)  # the hook's own
            return
        log.error(
            "hook %s did not return within %gs (its job's timeout); no longer waited for",
            _name(hook),
            timeout,
            extra=job_fields(job.claim),
        )
        if not is_async_callable(hook):
            threads.abandoned()  # its thread is still in it: the next hooks get another
    except BaseException as exc:
        _log_failure(hook, job, exc)


def _call_sync(hook: Callable[..., Any], job: JobContext) -> None:
    try:
        hook(job)
    except BaseException as exc:
        _log_failure(hook, job, exc)


def _enter_sync(manager: Any, job: JobContext) -> bool:
    """Enter a context manager; False (logged) if that raised."""
    try:
        manager.__enter__()
    except BaseException as exc:
        _log_failure(manager, job, exc)
        return False
    return True


async def _enter(manager: Any, job: JobContext) -> bool:
    """:func:`_enter_sync`, awaiting an async context manager."""
    if not _is_async(manager):
        return _enter_sync(manager, job)
    try:
        await manager.__aenter__()
    except BaseException as exc:
        _log_failure(manager, job, exc)
        return False
    return True


async def _enter_all(
    managers: Entered,
    enter: Callable[[Any, JobContext], Awaitable[bool]],
    job: JobContext,
    in_time: Callable[[Awaitable[Any]], Awaitable[Any]] | None = None,
) -> Entered:
    """Enter each (``enter``: False for one that failed, left out); those entered.

    An entry that the job's end cuts short (its timeout, a lost lease, a stop)
    exits the ones entered before it, as the handler's end would have: they
    were left entered, what they hold never given back. ``in_time``: the job's
    time for those exits when the error leaves it some (as after a handler)."""
    entered: Entered = []
    try:
        for manager in managers:
            if await enter(manager, job):
                entered.append(manager)
    except BaseException as exc:
        exits = _exit_all(entered, exc, job)
        await (exits if in_time is None or _out_of_time(exc) else in_time(exits))
        raise
    return entered


Details: TypeAlias = tuple[Any, Any, Any]


def _details(error: BaseException | None) -> Details:
    return (None, None, None) if error is None else (type(error), error, error.__traceback__)


def _exit_sync(manager: Any, details: Details, job: JobContext) -> None:
    """Exit one; what the exit returns is ignored (it cannot swallow the handler's
    exception), what it raises is logged."""
    try:
        manager.__exit__(*details)
    except BaseException as exc:
        _log_failure(manager, job, exc)


def _out_of_time(error: BaseException) -> bool:
    """Whether ``error`` says the job's time is up: its timeout passed (TimedOut
    from a thread, a cancellation on the loop) or the worker cancelled it."""
    return isinstance(error, TimedOut | asyncio.CancelledError)


async def _exit_all(entered: Entered, error: BaseException | None, job: JobContext) -> None:
    """Exit in reverse order, as :func:`_exit_sync` does, awaiting async ones;
    when the job is out of time, each of those for EXIT_GRACE_SECONDS at most.
    An exit cut short by the job's time running out does not cost the others
    theirs: they get their grace, then the cancellation goes on."""
    details = _details(error)
    graced = error is not None and _out_of_time(error)
    cut_short: asyncio.CancelledError | None = None
    for manager in reversed(entered):
        if not _is_async(manager):
            _exit_sync(manager, details, job)
            continue
        try:
            if graced:
                await _exit_within_grace(manager, details, job)
            else:
                await manager.__aexit__(*details)  # type: ignore[union-attr]
        except asyncio.CancelledError as cancelled:
            if not cancelling():  # the exit's own (it awaited a task cancelled)
                _log_failure(manager, job, cancelled)
                continue
            cut_short, graced = cancelled, True
        except BaseException as exc:
            _log_failure(manager, job, exc)
    if cut_short is not None:
        raise cut_short


async def _exit_within_grace(manager: Any, details: Details, job: JobContext) -> None:
    """Await an async exit for EXIT_GRACE_SECONDS at most (a timeout of its own:
    the one that ended the job has fired), then cancel it, logged."""
    scope = asyncio.timeout(EXIT_GRACE_SECONDS)
    try:
        async with scope:
            await manager.__aexit__(*details)
    except TimeoutError:
        if not scope.expired():
            raise  # the hook's own, logged as its failure
        log.error(
            "hook %s did not exit within %gs of its job's end; cancelled",
            _name(manager),
            EXIT_GRACE_SECONDS,
            extra=job_fields(job.claim),
        )


def _exit_all_sync(entered: Entered, error: BaseException | None, job: JobContext) -> None:
    details = _details(error)
    for manager in reversed(entered):
        _exit_sync(manager, details, job)


def _name(hook: object) -> str:
    return getattr(hook, "__qualname__", None) or type(hook).__qualname__


def _log_failure(hook: object, job: JobContext, error: BaseException | None = None) -> None:
    """A hook's failure is logged and the job goes on, whatever it raised: SystemExit
    or KeyboardInterrupt from a hook must not stop the worker (a handler's do not).
    A cancellation of the running task is the worker's (a timeout, a stop), not the
    hook's: raised on. Any other CancelledError is the hook's own (it awaited a task
    that was cancelled): a failure like any other."""
    if isinstance(error, asyncio.CancelledError) and cancelling():
        raise error
    log.exception(
        "hook %s failed on job %d; the job goes on",
        _name(hook),
        job.job_id,
        extra=job_fields(job.claim),
    )
