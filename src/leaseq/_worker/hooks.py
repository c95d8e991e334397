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
  thread starts, and around it). Whatever runs before the handler counts
  against the job's timeout: a hook that hangs times the attempt out;
* ``on_success(job, result)`` and ``on_failure(job, error, will_retry)`` run
  after the outcome was acknowledged: async hooks on the loop, plain ones in a
  thread of their own, so that a slow one never holds up the loop.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager, AbstractContextManager
from dataclasses import dataclass, field
from typing import Any, TypeAlias

from .._logs import get_logger, job_fields
from .context import JobContext

log = get_logger("leaseq.worker")

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
            await _call(hook, job, on_loop=True)
        entered = [cm for cm in self._managers(job) if await _enter(cm, job)]
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
        before_thread: Callable[[Awaitable[Any]], Awaitable[Any]],
    ) -> Any:
        """Run a plain handler in its thread (``run_in_thread``) inside the hooks:
        the sync ones in that thread, the async ones on the loop around it; those
        before the thread are awaited through ``before_thread`` (the job's timeout)."""
        for hook in self.before:
            if is_async_callable(hook):
                await before_thread(_call(hook, job, on_loop=True))
        managers = self._managers(job)
        entered_here = [
            cm for cm in managers if _is_async(cm) and await before_thread(_enter(cm, job))
        ]
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
            await _exit_all(entered_here, exc, job)
            raise
        await _exit_all(entered_here, None, job)
        return returned

    def _managers(self, job: JobContext) -> Entered:
        """Each around hook's context manager for this job (one that fails is left out)."""
        managers: Entered = []
        for hook in self.around:
            try:
                managers.append(hook(job))
            except Exception:
                _log_failure(hook, job)
        return managers

    # -- after the outcome ---------------------------------------------------------

    async def after(self, job: JobContext, label: str, result: Any, error: Any) -> None:
        """The outcome the database acknowledged: ``done``, ``retried`` or ``failed``."""
        if label == "done":
            for success in self.success:
                await _call(success, job, result, on_loop=False)
        elif label in ("retried", "failed"):
            for failure in self.failure:
                await _call(failure, job, error, label == "retried", on_loop=False)


def is_async_callable(function: object) -> bool:
    """Whether calling ``function`` gives a coroutine to await: an ``async def``, a
    partial of one, or an object whose ``__call__`` is one (run as a plain call, its
    coroutine was never awaited: the handler or hook silently never ran)."""
    call = inspect.getattr_static(type(function), "__call__", None)
    return inspect.iscoroutinefunction(function) or inspect.iscoroutinefunction(call)


def _is_async(manager: object) -> bool:
    return hasattr(manager, "__aenter__")


async def _call(hook: Callable[..., Any], job: JobContext, *args: Any, on_loop: bool) -> None:
    """Call a hook, logging what it raises; a plain one on the loop or in a thread."""
    try:
        if is_async_callable(hook):
            await hook(job, *args)
        elif on_loop:
            hook(job, *args)
        else:
            await asyncio.to_thread(hook, job, *args)
    except Exception:
        _log_failure(hook, job)


def _call_sync(hook: Callable[..., Any], job: JobContext) -> None:
    try:
        hook(job)
    except Exception:
        _log_failure(hook, job)


def _enter_sync(manager: Any, job: JobContext) -> bool:
    """Enter a context manager; False (logged) if that raised."""
    try:
        manager.__enter__()
    except Exception:
        _log_failure(manager, job)
        return False
    return True


async def _enter(manager: Any, job: JobContext) -> bool:
    """:func:`_enter_sync`, awaiting an async context manager."""
    if not _is_async(manager):
        return _enter_sync(manager, job)
    try:
        await manager.__aenter__()
    except Exception:
        _log_failure(manager, job)
        return False
    return True


Details: TypeAlias = tuple[Any, Any, Any]


def _details(error: BaseException | None) -> Details:
    return (None, None, None) if error is None else (type(error), error, error.__traceback__)


def _exit_sync(manager: Any, details: Details, job: JobContext) -> None:
    """Exit one; what the exit returns is ignored (it cannot swallow the handler's
    exception), what it raises is logged."""
    try:
        manager.__exit__(*details)
    except Exception:
        _log_failure(manager, job)


async def _exit_all(entered: Entered, error: BaseException | None, job: JobContext) -> None:
    """Exit in reverse order, as :func:`_exit_sync` does, awaiting async ones."""
    details = _details(error)
    for manager in reversed(entered):
        if not _is_async(manager):
            _exit_sync(manager, details, job)
            continue
        try:
            await manager.__aexit__(*details)  # type: ignore[union-attr]
        except Exception:
            _log_failure(manager, job)


def _exit_all_sync(entered: Entered, error: BaseException | None, job: JobContext) -> None:
    details = _details(error)
    for manager in reversed(entered):
        _exit_sync(manager, details, job)


def _log_failure(hook: object, job: JobContext) -> None:
    name = getattr(hook, "__qualname__", None) or type(hook).__qualname__
    log.exception(
        "hook %s failed on job %d; the job goes on",
        name,
        job.job_id,
        extra=job_fields(job.claim),
    )
