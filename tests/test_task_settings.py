"""A task's settings are checked where the task is declared, and taken in each
form the README gives them."""

from __future__ import annotations

import psycopg
import pytest

import leaseq
from leaseq import JobStatus
from leaseq.testing import drain


class NotAnError:
    pass


@pytest.mark.parametrize(
    "settings",
    [
        {"backoff": (1, 5, 9)},
        {"backoff": "1,5"},
        {"backoff": ("a", 5)},
        {"backoff": (True, 5)},
        {"backoff": (5, 1)},
        {"retry_on": "ValueError"},
        {"fail_on": (ValueError, "KeyError")},
        {"fail_on": NotAnError},
        {"retry_on": ValueError()},
        {"timeout": 0},
    ],
    ids=repr,
)
def test_a_task_declared_with_bad_settings_is_refused_where_it_is_declared(
    settings: dict[str, object],
) -> None:
    """Found only when a handler raised, a bad setting left the job running with
    no outcome until its lease ended, then ran it again."""
    app = leaseq.App()
    with pytest.raises(leaseq.InvalidArgument):
        app.task("reports", **settings)  # type: ignore[arg-type]
    assert app.tasks == {}


def test_a_single_exception_class_and_a_list_backoff_are_taken(
    queue: leaseq.Queue, database_url: str, schema: str
) -> None:
    app = leaseq.App(schema=schema)

    @app.task("permanent", fail_on=ValueError)
    def permanent(job: leaseq.JobContext) -> None:
        raise ValueError("bad data")

    @app.task("transient", retry_on=KeyError, backoff=[600, 600], max_attempts=3)
    def transient(job: leaseq.JobContext) -> None:
        raise KeyError("not yet")

    failed = queue.enqueue("permanent", {})
    retried = queue.enqueue("transient", {})
    stats = drain(app, dsn=database_url)
    assert (stats.failed, stats.retried) == (1, 1)
    assert queue.get(failed).status is JobStatus.FAILED
    job = queue.get(retried)
    assert job.status is JobStatus.QUEUED
    assert job.available_at is not None


@pytest.mark.parametrize("name", [["nightly"], None, 7, ""], ids=repr)
def test_a_periodic_job_with_a_bad_name_is_refused(name: object) -> None:
    app = leaseq.App()
    with pytest.raises(leaseq.InvalidArgument):
        app.periodic(name, queue="reports", every=60)  # type: ignore[arg-type]
    assert app.schedules == {}


def test_fail_on_and_retry_on_name_the_driver_errors_of_a_handlers_own_sql(
    queue: leaseq.Queue, database_url: str, schema: str
) -> None:
    """The handler's own SQL on leaseq's connections (job.transaction(),
    job.connection()) fails with leaseq's DatabaseError, raised from the driver's
    error; `fail_on=psycopg.errors.UniqueViolation` never matched it, so a
    duplicate the task said to fail at once was retried (and `retry_on` naming
    it failed the job at once)."""
    with queue.connection() as conn:
        conn.execute(f'CREATE TABLE "{schema}".biz (id int PRIMARY KEY)')
        conn.execute(f'INSERT INTO "{schema}".biz VALUES (1)')
    app = leaseq.App(schema=schema)
    seen: list[BaseException] = []

    def duplicate(job: leaseq.JobContext) -> None:
        try:
            with job.transaction() as conn:
                conn.execute(f'INSERT INTO "{schema}".biz VALUES (1)')
        except Exception as exc:
            seen.append(exc)
            raise

    app.task("fails", fail_on=psycopg.errors.UniqueViolation, max_attempts=5)(duplicate)
    app.task("retries", retry_on=psycopg.errors.UniqueViolation, backoff=(600, 600))(duplicate)
    failed = queue.enqueue("fails", {})
    retried = queue.enqueue("retries", {})
    drain(app, dsn=database_url)
    assert all(isinstance(exc.__cause__, psycopg.errors.UniqueViolation) for exc in seen), seen
    assert queue.get(failed).status is JobStatus.FAILED  # fail_on: at once
    job = queue.get(retried)
    assert (job.status, job.attempts) == (JobStatus.QUEUED, 1)  # retry_on: again later


def test_a_second_handler_for_a_queue_is_refused_however_it_is_declared() -> None:
    """One queue, one handler: the second one declared (a decorator applied twice,
    two declarations made before either was applied) silently replaced the first,
    whose jobs then ran another function."""
    app = leaseq.App()

    def first(job: leaseq.JobContext) -> None: ...
    def second(job: leaseq.JobContext) -> None: ...

    declare = app.task("reports")
    declare(first)
    with pytest.raises(leaseq.InvalidArgument, match="already has a handler"):
        declare(second)
    early = leaseq.App()
    one, other = early.task("reports"), early.task("reports")
    one(first)
    with pytest.raises(leaseq.InvalidArgument, match="already has a handler"):
        other(second)
    assert app.tasks["reports"].handler is first
    assert early.tasks["reports"].handler is first


def test_a_task_declared_without_its_queue_says_so() -> None:
    """``@app.task`` without parentheses passes the function as the queue's name."""
    app = leaseq.App()

    def reports(job: leaseq.JobContext) -> None: ...

    with pytest.raises(leaseq.InvalidArgument, match=r"@app.task\('queue'"):
        app.task(reports)  # type: ignore[arg-type]
    assert app.tasks == {}
