"""Registering handlers: an App maps queue names to tasks and their settings."""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from .. import _validate as validate
from .. import _validate_payloads as payload_checks
from .._errors import InvalidArgument
from .._retry import Backoff, ErrorPolicy
from .._types import Claim
from .hooks import AroundHook, BeforeHook, FailureHook, Hooks, SuccessHook, is_async_callable
from .schedules import Schedule, schedule

Handler = Callable[..., Any]
H = TypeVar("H", bound=Handler)
B = TypeVar("B", bound=BeforeHook)
A = TypeVar("A", bound=AroundHook)
S = TypeVar("S", bound=SuccessHook)
F = TypeVar("F", bound=FailureHook)


@dataclass(frozen=True, slots=True)
class Task:
    """A handler and its per-task settings (None: the queue's setting)."""

    queue: str
    handler: Handler
    is_async: bool
    max_attempts: int | None
    backoff: Backoff | None
    lease: float | None
    timeout: float | None
    errors: ErrorPolicy
    #: The cap on the JSON of a handler's return value (the job's result).
    max_result_bytes: int = payload_checks.DEFAULT_MAX_RESULT_BYTES
    #: Where a plain handler runs: "thread" (the worker's process) or "process"
    #: (a child process of its own: CPU-bound work, .processes).
    executor: str = "thread"

    def timeout_of(self, claim: Claim) -> float | None:
        """The job's own timeout (``enqueue(timeout=...)``), else the task's."""
        return self.timeout if claim.timeout is None else claim.timeout

    def retry_delay(self, attempt: int) -> float | None:
        """The task's own backoff, or None for the queue's (computed by the database)."""
        return None if self.backoff is None else self.backoff.delay(attempt)

    def attempts_left(self, attempts: int, job_max_attempts: int) -> bool:
        return attempts < self.attempt_limit(job_max_attempts)

    def attempt_limit(self, job_max_attempts: int) -> int:
        """How many attempts a job of this task may have: the task's, within the job's own."""
        limit = job_max_attempts if self.max_attempts is None else self.max_attempts
        return min(limit, job_max_attempts)


class App:
    """The handlers a worker runs, one per queue."""

    def __init__(self, dsn: str | None = None, *, schema: str = "leaseq") -> None:
        self.dsn = validate.dsn(dsn, "dsn")
        self.schema = validate.schema_name(schema)
        self.tasks: dict[str, Task] = {}
        self.schedules: dict[str, Schedule] = {}
        #: What runs around every job of this app (``.hooks``).
        self.hooks = Hooks()

    @staticmethod
    def load(reference: str) -> App:
        """The App named by ``module:attribute`` (what ``leaseq worker`` takes)."""
        return load_app(reference)

    def task(
        self,
        queue: str,
        *,
        max_attempts: int | None = None,
        backoff: Backoff | tuple[float, float] | None = None,
        lease: float | None = None,
        timeout: float | None = None,
        retry_on: type[BaseException] | tuple[type[BaseException], ...] = (),
        fail_on: type[BaseException] | tuple[type[BaseException], ...] = (),
        max_result_bytes: int = payload_checks.DEFAULT_MAX_RESULT_BYTES,
        executor: str = "thread",
    ) -> Callable[[H], H]:
        """Register the decorated function as the handler of ``queue``.

        It receives a :class:`~leaseq._worker.JobContext`; ``async def`` handlers run
        on the event loop, plain ones in a thread pool, or with
        ``executor="process"`` in child processes (CPU-bound work: the GIL then
        holds up neither the other jobs nor the lease renewals; the handler must
        be a module-level function). What it returns (JSON, at most
        ``max_result_bytes``) is stored with the job's completion, its result.
        ``max_attempts`` lowers each job's own budget (the enqueue's, else the
        queue's: 20 by default), never raises it.
        """
        if callable(queue):  # ``@app.task`` without its parentheses
            raise InvalidArgument(
                "app.task takes the queue's name first: @app.task('queue', ...), "
                f"got {getattr(queue, '__qualname__', type(queue).__name__)}"
            )
        validate.queue_name(queue)
        self._check_free(queue)
        if max_attempts is not None:
            validate.integer(max_attempts, "max_attempts", range(1, 1001))
        if backoff is not None:
            backoff = Backoff.of(backoff)
        errors = ErrorPolicy(
            retry_on=ErrorPolicy.exceptions(retry_on, "retry_on"),
            fail_on=ErrorPolicy.exceptions(fail_on, "fail_on"),
        )
        validate.integer(
            max_result_bytes, "max_result_bytes", range(1, payload_checks.MAX_PAYLOAD_BYTES_CAP + 1)
        )
        settings = (
            validate.lease(lease),
            None
            if timeout is None
            else validate.seconds(timeout, "timeout", 7 * 86400.0, allow_zero=False),
        )

        if executor not in EXECUTORS:
            raise InvalidArgument(
                f"executor must be one of {', '.join(EXECUTORS)}, got {executor!r}"
            )

        def register(handler: H) -> H:
            _check_callable(handler, f"the handler of queue {queue!r}")
            # Again here: this decorator applied twice, or another declared for the
            # queue before either was applied, replaced the first handler in silence.
            self._check_free(queue)
            if executor == "process":
                _check_process_handler(queue, handler)
            self.tasks[queue] = Task(
                queue=queue,
                handler=handler,
                is_async=is_async_callable(handler),
                max_attempts=max_attempts,
                backoff=backoff,
                lease=settings[0],
                timeout=settings[1],
                errors=errors,
                max_result_bytes=max_result_bytes,
                executor=executor,
            )
            return handler

        return register

    def _check_free(self, queue: str) -> None:
        if queue in self.tasks:
            raise InvalidArgument(f"queue {queue!r} already has a handler")

    # -- hooks (see leaseq._worker.hooks: where each runs; a hook never changes
    #    or loses an outcome: what it raises is logged) -------------------------

    def before_job(self, hook: B) -> B:
        """Decorator: ``hook(job)`` runs before every handler, where the handler runs."""
        _check_callable(hook, "a before_job hook")
        self.hooks.before.append(hook)
        return hook

    def around_job(self, hook: A) -> A:
        """Decorator: ``hook(job)`` returns a context manager (sync or async) that
        wraps every handler call, e.g. a ``@contextmanager`` that opens a span.
        It sees the handler's exception but cannot swallow or replace it."""
        _check_callable(hook, "a around_job hook")
        self.hooks.around.append(hook)
        return hook

    def on_success(self, hook: S) -> S:
        """Decorator: ``hook(job, result)`` runs once a job's completion committed."""
        _check_callable(hook, "a on_success hook")
        self.hooks.success.append(hook)
        return hook

    def on_failure(self, hook: F) -> F:
        """Decorator: ``hook(job, error, will_retry)`` runs once a failed attempt's
        retry (``will_retry``) or final failure committed; ``error`` is the
        exception the handler raised, or a description (a timeout)."""
        _check_callable(hook, "a on_failure hook")
        self.hooks.failure.append(hook)
        return hook

    def periodic(
        self,
        name: str,
        *,
        queue: str,
        cron: str | None = None,
        every: float | None = None,
        payload: Any = None,
        tz: str = "UTC",
        catch_up: float = 0.0,
        priority: int = 0,
        max_attempts: int | None = None,
    ) -> Schedule:
        """Enqueue a job of ``queue`` with ``payload`` at every tick of ``cron`` (in
        time zone ``tz``) or ``every`` seconds, exactly once per tick across all of
        the app's workers. After a downtime the latest missed tick is enqueued, and
        the earlier ones no older than ``catch_up`` seconds; the rest are skipped
        and counted. Each job's idempotency key names its tick."""
        declared = schedule(
            name,
            queue=queue,
            cron=cron,
            every=every,
            payload=payload,
            tz=tz,
            catch_up=catch_up,
            priority=priority,
            max_attempts=max_attempts,
        )
        if declared.name in self.schedules:  # (the name checked first: a list is unhashable)
            raise InvalidArgument(f"schedule {name!r} is already declared")
        self.schedules[name] = declared
        return declared


#: Where a plain handler may run (App.task's ``executor``).
EXECUTORS = ("thread", "process")


def _check_process_handler(queue: str, handler: Handler) -> None:
    """A child process finds the handler by its module and name, and runs it as a
    plain call: no coroutine, nothing defined inside a function."""
    if is_async_callable(handler):
        raise InvalidArgument(
            f"queue {queue!r}: an async def handler runs on the event loop; "
            'executor="process" takes a plain def'
        )
    qualname = getattr(handler, "__qualname__", "")
    if (
        not inspect.isfunction(handler)  # a callable object, a partial, a bound method
        or "<locals>" in qualname
        or "<lambda>" in qualname
        or not getattr(handler, "__module__", "")
    ):
        raise InvalidArgument(
            f'queue {queue!r}: a handler with executor="process" must be a module-level '
            f"function (its process imports it by name), got {qualname or handler!r}"
        )


def load_app(reference: str) -> App:
    """Import ``module:attribute`` (the CLI's MODULE:APP argument)."""
    module_name, _, attribute = reference.partition(":")
    if not module_name or not attribute:
        raise InvalidArgument(f"expected MODULE:APP, got {reference!r}")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise InvalidArgument(f"cannot import {module_name!r}: {exc}") from exc
    app = getattr(module, attribute, None)
    if not isinstance(app, App):
        raise InvalidArgument(f"{reference!r} is not a leaseq App")
    return app


def _check_callable(function: object, what: str) -> None:
    """Refused where it is declared: an object that cannot be called failed every
    attempt of every job with a TypeError, in the worker."""
    if not callable(function):
        raise InvalidArgument(f"{what} must be callable, got {type(function).__name__}")
