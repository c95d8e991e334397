"""A task's settings are checked where the task is declared, and taken in each
form the README gives them."""

from __future__ import annotations

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
