"""The worker side: the App ``manage.py leaseq_worker`` runs, and the handler that
runs a task of Django's task framework inside Django's connection handling."""

from __future__ import annotations

import contextlib
import copy
import functools
import inspect
import traceback
from collections.abc import Callable, Iterable
from dataclasses import replace
from typing import Any, TypeVar, cast

from django.core.exceptions import ImproperlyConfigured
from django.db import close_old_connections
from django.utils import timezone

from leaseq import App, InvalidResult, JobContext, PermanentError, Retry

from ._framework import (
    InvalidTaskError,
    TaskContext,
    TaskResult,
    TaskResultStatus,
    task_backends,
    task_finished,
)
from ._framework import task_started as task_started_signal
from .conf import leaseq_settings
from .tasks import LeaseqBackend, TaskFailed, load_task, status, to_json

__all__ = ["django_connections", "run_task", "task_queues", "worker_app"]

#: How much of a failed task's traceback its job's error keeps (leaseq keeps 2000
#: characters of an error): the end, where the exception was raised.
TRACEBACK_CHARS = 1500


def task_queues() -> dict[str, LeaseqBackend]:
    """The queues of every LeaseqBackend in ``TASKS``, each with its backend."""
    found: dict[str, LeaseqBackend] = {}
    for alias in task_backends.settings:
        backend = task_backends[alias]
        if isinstance(backend, LeaseqBackend):
            for name in sorted(backend.queues):
                found.setdefault(name, backend)
    return found


def worker_app(queues: Iterable[str] | None = None) -> App:
    """A :class:`leaseq.App` on ``settings.LEASEQ``'s database and schema with the
    handlers of ``LEASEQ["APP"]`` (``"module:app"``, if set) and, for each queue of
    a LeaseqBackend in ``TASKS`` (and each of ``queues`` without a handler of its
    own), the handler that runs tasks of Django's task framework."""
    config = leaseq_settings()
    app = App(config.dsn(), schema=config.schema)
    if config.app:
        # A copy of your App (its hooks too) on the settings' database and schema.
        own = App.load(config.app)
        app = copy.copy(own)
        app.dsn, app.schema = config.dsn(), App(schema=config.schema).schema
        app.schedules = dict(own.schedules)
        # Its plain on_success/on_failure hooks run in threads of their own (the
        # worker's hook threads), never between a handler's connection checks:
        # checked around each call too, or a thread's connection once broken (a
        # server restart, a failover) stayed broken for every later hook.
        app.hooks = replace(
            own.hooks,
            success=[_checked(hook) for hook in own.hooks.success],
            failure=[_checked(hook) for hook in own.hooks.failure],
        )
        app.tasks = {}
        for name, task in own.tasks.items():
            # Sync handlers run in the worker's threads, with Django connections of
            # their own: checked around each job as around a request.
            in_thread = not task.is_async and getattr(task, "executor", "thread") == "thread"
            handler = django_connections(task.handler) if in_thread else task.handler
            app.tasks[name] = replace(task, handler=handler)
    for name in [*task_queues(), *(queues or ())]:
        if name not in app.tasks:
            app.task(name)(run_task)
    return app


H = TypeVar("H", bound=Callable[..., Any])


def django_connections(handler: H) -> H:
    """``handler`` between Django's connection checks, as a request is: the
    thread's connections that are broken, or past ``CONN_MAX_AGE`` (0: all of
    them), are closed before and after it."""

    @functools.wraps(handler)
    def run(*args: Any, **kwargs: Any) -> Any:
        close_old_connections()
        try:
            return handler(*args, **kwargs)
        finally:
            close_old_connections()

    return cast(H, run)


def _checked(hook: H) -> H:
    """A plain hook between Django's connection checks (an async one runs on the
    event loop, where Django's ORM is not called synchronously: as it is)."""
    call = inspect.getattr_static(type(hook), "__call__", None)
    is_async = inspect.iscoroutinefunction(hook) or inspect.iscoroutinefunction(call)
    return hook if is_async else django_connections(hook)


@django_connections
def run_task(job: JobContext) -> Any:
    """Run the task a job names (a sync handler: in one of the worker's threads)."""
    return _run(job)


def _run(job: JobContext) -> Any:
    payload = job.payload
    declared = load_task(payload["task"])
    task = declared
    # As enqueued (.using()): the job's backend, queue and priority (jobs enqueued
    # before the payload carried it: the task's declared one).
    with contextlib.suppress(InvalidTaskError, ImproperlyConfigured):
        task = replace(
            declared,
            backend=payload.get("backend", declared.backend),
            queue_name=job.queue,
            priority=payload.get("priority", declared.priority),
        )
    args, kwargs = payload.get("args", []), payload.get("kwargs", {})
    now = timezone.now()
    result: TaskResult[Any] = TaskResult(
        task=task,
        id=str(job.job_id),
        status=status("RUNNING"),
        enqueued_at=None,
        started_at=now,
        finished_at=None,
        last_attempted_at=now,
        args=args,
        kwargs=kwargs,
        backend=payload.get("backend", task.backend),
        errors=[],
        worker_ids=["leaseq"] * job.attempts,
    )
    backend_class = type(task.get_backend())
    task_started_signal.send_robust(backend_class, task_result=result)
    try:
        if task.takes_context:
            value = task.call(TaskContext(task_result=result), *args, **kwargs)
        else:
            value = task.call(*args, **kwargs)
    except (Retry, PermanentError):
        _finished(result, status("FAILED"), backend_class)
        raise  # leaseq's own verdicts, as a handler gives them
    except Exception as exc:
        _finished(result, status("FAILED"), backend_class)
        raise TaskFailed(_describe(exc)) from exc
    try:
        to_json(value, "return value")
    except TypeError as exc:
        # The job fails for it (InvalidResult): the signal says so, as Django's
        # own backends do, which turn the value into JSON before they finish.
        _finished(result, status("FAILED"), backend_class)
        raise InvalidResult(f"result cannot be stored: {exc}") from None
    if job.lost.is_set():
        # Returned after its attempt ended (its timeout, a lost lease, the
        # worker's stop): the worker does not take this return as the job's.
        _finished(result, status("FAILED"), backend_class)
        return value
    _finished(result, status("SUCCESSFUL"), backend_class)
    return value


def _finished(result: TaskResult[Any], status: TaskResultStatus, sender: type) -> None:
    object.__setattr__(result, "status", status)
    object.__setattr__(result, "finished_at", timezone.now())
    task_finished.send_robust(sender, task_result=result)


def _describe(exc: BaseException) -> str:
    """``module.Class: message``, then the end of the traceback."""
    kind = type(exc)
    path = f"{kind.__module__}.{kind.__qualname__}"
    message = str(exc).split("\n", 1)[0]
    trace = "".join(traceback.format_exception(exc))
    if len(trace) > TRACEBACK_CHARS:
        trace = "…" + trace[-TRACEBACK_CHARS:]
    return f"{path}: {message}\n{trace}" if message else f"{path}\n{trace}"
