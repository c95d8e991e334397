"""Module-level handlers for tests/test_process_handlers.py (a child process imports
them by name). Each payload names the test's schema; each handler records what it
saw in ``{schema}.seen`` on an autocommit connection, so a killed attempt keeps it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from typing import Any

import leaseq

TABLES = (
    "CREATE TABLE {schema}.seen (job_id bigint, attempt int, pid int, what text)",
    "CREATE TABLE {schema}.effect (job_id bigint, idempotency_key text)",
)


def _record(job: leaseq.JobContext, what: str) -> None:
    with job.connection() as conn:
        conn.execute(
            f'INSERT INTO "{job.payload["schema"]}".seen VALUES (%s, %s, %s, %s)',
            (job.job_id, job.attempts, os.getpid(), what),
        )


def spin(job: leaseq.JobContext) -> dict[str, Any]:
    """CPU-bound: a pure-Python loop of payload['n'] steps (holds the GIL in a thread)."""
    total = 0
    for i in range(int(job.payload["n"])):
        total += i * i % 7
    return {"pid": os.getpid(), "total": total}


def effect(job: leaseq.JobContext) -> None:
    """The effect and the completion in one transaction, from the child."""
    with job.transaction() as conn:
        conn.execute(
            f'INSERT INTO "{job.payload["schema"]}".effect VALUES (%s, %s)',
            (job.job_id, job.idempotency_key),
        )
        job.result = {"written_by": os.getpid()}


def polite(job: leaseq.JobContext) -> None:
    """First attempt: wait to be told (job.lost), say so, then try to complete with an
    effect (which must be refused). Later attempts: the effect, completed."""
    if job.attempts == 1:
        _record(job, "started")
        if job.lost.wait(60):
            _record(job, "told")
    effect(job)


def stubborn(job: leaseq.JobContext) -> None:
    """First attempt: never looks at job.lost, runs on (until killed)."""
    if job.attempts == 1:
        _record(job, "started")
        time.sleep(60)
        _record(job, "still alive")
    effect(job)


def _start_grandchild(job: leaseq.JobContext) -> None:
    """A process of the handler's own (a tool it runs, say), recorded with its pid."""
    grandchild = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    with job.connection() as conn:
        conn.execute(
            f'INSERT INTO "{job.payload["schema"]}".seen VALUES (%s, %s, %s, %s)',
            (job.job_id, job.attempts, grandchild.pid, "grandchild"),
        )


def stubborn_parent(job: leaseq.JobContext) -> None:
    """Starts a process of its own, then never looks at job.lost (until killed)."""
    _record(job, "started")
    _start_grandchild(job)
    time.sleep(60)


def crashing_parent(job: leaseq.JobContext) -> None:
    """Starts a process of its own, then dies under the handler."""
    _record(job, "started")
    _start_grandchild(job)
    os._exit(3)


def crash(job: leaseq.JobContext) -> None:
    """First attempt: the process dies under the handler."""
    if job.attempts == 1:
        os._exit(3)
    effect(job)


class CustomerGone(leaseq.PermanentError):
    """A PermanentError whose constructor takes two arguments: pickle rebuilds an
    exception from its ``args`` (one, the message), which this one refuses."""

    def __init__(self, customer: int, why: str) -> None:
        super().__init__(f"customer {customer}: {why}")
        self.customer = customer


class Locked(Exception):
    """An error a task lists in ``fail_on``, with a two-argument constructor."""

    def __init__(self, what: str, number: int) -> None:
        super().__init__(f"{what} {number} is locked")


def raises(job: leaseq.JobContext) -> None:
    """payload['raise']: retry (job.retry with a delay), permanent, stop, value."""
    match job.payload["raise"]:
        case "retry":
            job.retry(delay=600, reason="later, please")
        case "permanent":
            raise leaseq.PermanentError("not worth a retry")
        case "stop":
            next(iter(()))  # StopIteration, which no Future takes as it is
        case "permanent_two_args":
            raise CustomerGone(7, "deleted")
        case "fail_on_two_args":
            raise Locked("invoice", 12)
        case _:
            raise ValueError("bad value")


def unsendable(job: leaseq.JobContext) -> Any:
    """payload['what']: a lambda, or a list nested past pickle's recursion limit:
    results no attempt can send back from the child."""
    if job.payload["what"] == "lambda":
        return lambda: 1
    if job.payload["what"] == "refuses":
        return Unreducible()
    if job.payload["what"] == "unreceivable":
        return Unreceivable(1, 2)
    nested: Any = []
    for _ in range(200_000):
        nested = [nested]
    return nested


def patient(job: leaseq.JobContext) -> None:
    """Say it started (with its pid), take two seconds, then the effect, completed."""
    _record(job, "started")
    time.sleep(2)
    effect(job)


def completes_then_works(job: leaseq.JobContext) -> None:
    """The effect and the completion first, then three more seconds of work."""
    effect(job)
    time.sleep(3)
    _record(job, "worked on")


def traced(job: leaseq.JobContext) -> dict[str, str | None]:
    """The span context current in the child, as the handler's own spans would see it."""
    from opentelemetry import trace

    context = trace.get_current_span().get_span_context()
    if not context.is_valid:
        return {"trace_id": None, "span_id": None}
    return {"trace_id": f"{context.trace_id:032x}", "span_id": f"{context.span_id:016x}"}


def completes_then_dies(job: leaseq.JobContext) -> None:
    """The effect and the completion (with a result), then killed outright (the
    OOM killer)."""
    with job.transaction() as conn:
        conn.execute(
            f'INSERT INTO "{job.payload["schema"]}".effect VALUES (%s, %s)',
            (job.job_id, job.idempotency_key),
        )
        job.result = {"effect": "done"}
    os.kill(os.getpid(), signal.SIGKILL)


def completes_then_hangs(job: leaseq.JobContext) -> None:
    """The effect and the completion, then never returns, deaf to job.lost."""
    effect(job)
    while True:
        time.sleep(0.1)


class CallableHandler:
    """A callable object: a handler in a thread, none a process can import."""

    def __call__(self, job: leaseq.JobContext) -> None:
        pass


class Unreducible:
    """A value whose pickling raises ValueError (its ``__reduce__`` refuses)."""

    def __reduce__(self) -> Any:
        raise ValueError("not today")


class Unreceivable:
    """A value that pickles in the child but whose unpickling raises TypeError in
    the worker: its ``__reduce__`` passes its constructor one argument of two."""

    def __init__(self, x: int, y: int) -> None:
        self.x, self.y = x, y

    def __reduce__(self) -> Any:
        return (Unreceivable, (self.x,))


def completes_then_changes_its_result(job: leaseq.JobContext) -> None:
    """Completes with one result, then sets another (stored nowhere)."""
    with job.transaction():
        job.result = "committed"
    job.result = "set after the commit"
