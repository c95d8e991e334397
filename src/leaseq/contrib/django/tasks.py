"""A backend for Django's task framework that runs tasks on leaseq workers::

    TASKS = {
        "default": {
            "BACKEND": "leaseq.contrib.django.tasks.LeaseqBackend",
            "QUEUES": ["default", "emails"],           # leaseq queues, one per name
            "OPTIONS": {"MAX_ATTEMPTS": 3, "TIMEOUT": 600},  # optional, per job
        }
    }

``task.enqueue(...)`` inserts a leaseq job on Django's connection (in the caller's
``transaction.atomic()`` block, if any, committing or rolling back with it); the
task result's id is the job's id. ``manage.py leaseq_worker`` runs them.

The job's payload is ``{"task": "module.function", "args": [...], "kwargs": {...},
"backend": alias, "priority": n}``; the framework's priority (-100..100, higher
first) is the job's priority (leaseq's order too; the payload repeats it for the
worker's signals, which see the claim, not the row), ``run_after`` its ``run_at``,
the task's return value (JSON) the job's result.
"""

from __future__ import annotations

import builtins
import contextlib
import json
from dataclasses import replace
from typing import Any, ParamSpec, TypeVar

from django.core.exceptions import ImproperlyConfigured
from django.utils import timezone
from django.utils.module_loading import import_string

import leaseq
from leaseq import App, InvalidJob, Job, JobNotFound, JobStatus, LeaseqError

from . import enqueue as enqueue_job
from . import queue, reading_in_atomic
from ._framework import (
    BaseTaskBackend,
    InvalidTaskError,
    Task,
    TaskError,
    TaskResult,
    TaskResultDoesNotExist,
    TaskResultStatus,
    task_enqueued,
)

__all__ = ["TASK_FAILED_PREFIX", "LeaseqBackend", "TaskFailed", "task_result"]

T = TypeVar("T")
P = ParamSpec("P")

#: The options a backend's ``OPTIONS`` may hold.
OPTIONS = frozenset({"MAX_ATTEMPTS", "TIMEOUT"})

STATUSES = {
    JobStatus.QUEUED: "READY",
    JobStatus.RUNNING: "RUNNING",
    JobStatus.DONE: "SUCCESSFUL",
    JobStatus.FAILED: "FAILED",
    # The framework has no "cancelled": a cancelled task did not succeed and never
    # will; its error says it was cancelled.
    JobStatus.CANCELLED: "FAILED",
}


class TaskFailed(Exception):
    """A task function raised: carries its exception's class path, message and the
    end of its traceback into the job's error, for the task result's ``errors``."""


TASK_FAILED_PREFIX = f"{TaskFailed.__name__}: "


def check_queue_name(name: str) -> str:
    """leaseq's rule for queue names (InvalidJob), through the public API."""
    App().task(name)  # it validates, and registers nothing
    return name


def status(name: str) -> TaskResultStatus:
    """A status by its name (typed: Django's enums have no inline types)."""
    return TaskResultStatus(name)


def to_json(value: Any, what: str) -> Any:
    """``value`` as JSON would give it back (tuples become lists), else TypeError,
    also for a mapping two of whose keys JSON makes one ({1: …, "1": …}): the
    round trip would keep one of the two values, silently, where leaseq's own
    enqueue refuses such a payload."""
    try:
        returned = json.loads(json.dumps(value, allow_nan=False))
    # RecursionError: nested past what the encoder's recursion takes (leaseq's own
    # bound on nesting, far below, is its enqueue's to say).
    except (TypeError, ValueError, RecursionError) as exc:
        raise TypeError(f"the task's {what} must be JSON-serializable: {exc}") from None
    if _lost_keys(value, returned):
        raise TypeError(
            f"the task's {what} must be JSON-serializable: a mapping has keys that "
            "become the same JSON text"
        )
    return returned


def _lost_keys(value: Any, returned: Any) -> bool:
    """Whether a mapping of ``value`` came back from JSON with fewer keys."""
    pairs = [(value, returned)]
    while pairs:
        given, back = pairs.pop()
        if isinstance(given, dict):
            if len(back) < len(given):
                return True
            # (json keeps a mapping's order both ways: its keys pair up in turn)
            pairs.extend((given[g], back[b]) for g, b in zip(given, back, strict=True))
        elif isinstance(given, list | tuple):
            pairs.extend(zip(given, back, strict=True))
    return False


class LeaseqBackend(BaseTaskBackend):
    """Django's task framework on leaseq: see the module's docstring and docs/django.md."""

    supports_defer = True
    supports_async_task = True
    supports_get_result = True
    supports_priority = True

    def __init__(self, alias: str, params: dict[str, Any]) -> None:
        super().__init__(alias, params)
        unknown = set(self.options) - OPTIONS
        if unknown:
            raise ImproperlyConfigured(
                f"TASKS[{alias!r}]['OPTIONS']: unknown keys {sorted(unknown)} "
                f"(known: {sorted(OPTIONS)})"
            )
        for name in self.queues:
            try:
                check_queue_name(name)
            except InvalidJob as exc:
                raise ImproperlyConfigured(f"TASKS[{alias!r}]['QUEUES']: {exc}") from None
        self.max_attempts: int | None = self.options.get("MAX_ATTEMPTS")
        self.timeout: float | None = self.options.get("TIMEOUT")
        attempts, timeout = self.max_attempts, self.timeout
        if attempts is not None and (
            isinstance(attempts, bool) or not isinstance(attempts, int) or not 1 <= attempts <= 1000
        ):
            raise ImproperlyConfigured(
                f"TASKS[{alias!r}]['OPTIONS']['MAX_ATTEMPTS'] must be an integer in [1, 1000]"
            )
        if timeout is not None and (
            isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout <= 0
        ):
            raise ImproperlyConfigured(
                f"TASKS[{alias!r}]['OPTIONS']['TIMEOUT'] must be a positive number of seconds"
            )

    def validate_task(self, task: Task[Any, Any]) -> None:
        super().validate_task(task)
        try:
            check_queue_name(task.queue_name)
        except InvalidJob as exc:
            raise InvalidTaskError(str(exc)) from None

    def enqueue(
        self,
        task: Task[P, T],
        args: P.args,  # type: ignore[valid-type]
        kwargs: P.kwargs,  # type: ignore[valid-type]
    ) -> TaskResult[T]:
        """Insert the task's job on Django's connection, in its transaction if one
        is open. Nothing is written when the task, its arguments (JSON) or its
        queue's name are refused."""
        self.validate_task(task)
        payload = {
            "task": task.module_path,
            "args": to_json(list(args), "args"),
            "kwargs": to_json(dict(kwargs), "kwargs"),
            "backend": self.alias,
            "priority": task.priority,
        }
        run_at = task.run_after
        if run_at is not None and timezone.is_naive(run_at):
            run_at = timezone.make_aware(run_at)  # USE_TZ = False: the current time zone
        try:
            job_id = enqueue_job(
                task.queue_name,
                payload,
                run_at=run_at,
                priority=task.priority,
                max_attempts=self.max_attempts,
                timeout=self.timeout,
            )
        except InvalidJob as exc:
            raise InvalidTaskError(str(exc)) from exc
        result: TaskResult[T] = TaskResult(
            task=task,
            id=str(job_id),
            status=status("READY"),
            enqueued_at=timezone.now(),
            started_at=None,
            finished_at=None,
            last_attempted_at=None,
            args=payload["args"],
            kwargs=payload["kwargs"],
            backend=self.alias,
            errors=[],
            worker_ids=[],
        )
        task_enqueued.send(type(self), task_result=result)
        return result

    def get_result(self, result_id: str) -> TaskResult[Any]:
        """The task's job as it is now (TaskResultDoesNotExist if there is none, or
        it is not a task of this backend, or retention removed it). Inside
        ``atomic()`` it is read in the block's transaction, as the ORM reads:
        a task enqueued in the block is found there before it commits."""
        try:
            job_id = int(result_id)
        except (TypeError, ValueError):
            raise TaskResultDoesNotExist(result_id) from None
        if not 0 < job_id < 2**63:  # "0", "-1", past bigint: no job has that id
            raise TaskResultDoesNotExist(result_id)
        jobs = queue()
        try:
            with reading_in_atomic() as conn:
                job = jobs.get(job_id, conn=conn)
                value = jobs.result(job_id, conn=conn) if job.status is JobStatus.DONE else None
        except JobNotFound:
            raise TaskResultDoesNotExist(result_id) from None
        payload = job.payload
        if not (
            isinstance(payload, dict)
            and isinstance(payload.get("task"), str)
            and payload.get("backend") == self.alias
        ):
            raise TaskResultDoesNotExist(result_id)
        task = load_task(payload["task"])
        return task_result(self.alias, task, job, value)


def load_task(path: str) -> Task[Any, Any]:
    """The Task object a module's attribute ``path`` names (the decorated function)."""
    try:
        found = import_string(path)
    except ImportError as exc:
        raise InvalidTaskError(f"cannot import the task {path!r}: {exc}") from exc
    if not isinstance(found, Task):
        raise InvalidTaskError(f"{path!r} is not a task (decorate it with @task)")
    return found


def task_result(alias: str, task: Task[Any, Any], job: Job, value: Any = None) -> TaskResult[Any]:
    """The framework's view of a leaseq job of ``task``."""
    payload = job.payload
    as_enqueued = task
    # The job's own priority and queue, as .using() gave them; if the settings
    # changed since and refuse them, the task as it is declared now.
    with contextlib.suppress(InvalidTaskError, ImproperlyConfigured):
        as_enqueued = replace(task, priority=job.priority, queue_name=job.queue, backend=alias)
    finished = job.status.finished
    result: TaskResult[Any] = TaskResult(
        task=as_enqueued,
        id=str(job.job_id),
        status=status(STATUSES[job.status]),
        enqueued_at=job.created_at,
        started_at=job.claimed_at,
        finished_at=job.finished_at if finished else None,
        last_attempted_at=job.claimed_at,
        args=payload.get("args", []),
        kwargs=payload.get("kwargs", {}),
        backend=alias,
        errors=errors_of(job),
        # leaseq does not record which worker ran an attempt: one entry per attempt.
        worker_ids=["leaseq"] * job.attempts,
    )
    if job.status is JobStatus.DONE:
        object.__setattr__(result, "_return_value", value)
    return result


def errors_of(job: Job) -> list[TaskError]:
    """One TaskError per failed attempt of the job's history, and one for its
    cancellation (by whom); its last error if the history holds none."""
    errors = []
    for entry in job.history:
        if entry.get("error"):
            errors.append(task_error(str(entry["error"])))
        elif entry.get("outcome") == "cancelled":
            errors.append(
                TaskError(
                    exception_class_path=f"leaseq.{LeaseqError.__name__}",
                    traceback=f"cancelled by {entry.get('actor') or 'an operator'}",
                )
            )
    if not errors and job.last_error and job.status.finished:
        errors.append(task_error(job.last_error))
    return errors


def task_error(text: str) -> TaskError:
    """A job's error text as a TaskError: a task's own exception (TaskFailed's text:
    its class path, then the traceback's end), else leaseq's (a timeout, an
    expired lease, a result that is not JSON)."""
    if text.startswith(TASK_FAILED_PREFIX):
        body = text.removeprefix(TASK_FAILED_PREFIX)
        path = body.split("\n", 1)[0].split(": ", 1)[0]
        return TaskError(exception_class_path=path, traceback=body)
    name = text.split(":", 1)[0].strip()
    if name in leaseq.__all__ and isinstance(getattr(leaseq, name), type):
        path = f"leaseq.{name}"
    elif isinstance(getattr(builtins, name, None), type) and issubclass(
        getattr(builtins, name), BaseException
    ):
        path = f"builtins.{name}"
    else:
        path = f"leaseq.{LeaseqError.__name__}"
    return TaskError(exception_class_path=path, traceback=text)
