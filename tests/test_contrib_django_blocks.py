"""The Django blocks that complete a job with its effect (job_atomic) and the
Django worker: a block Django rolls back completes nothing, a block inside
another is refused, the worker command's options as given, and the app's
after hooks get a working ORM connection."""

from __future__ import annotations

import contextlib
from typing import Any

import pytest

import leaseq
from leaseq import JobStatus
from leaseq.testing import drain

# The Django tests' own fixtures (imported: pytest finds them here).
from .test_contrib_django import _until, django_schema, run_worker, shop  # noqa: F401

django = pytest.importorskip("django")

from django.db import transaction  # noqa: E402

# -- job_atomic: a block Django rolls back must not report a completion ---------------


class _Rollback:
    """The two ways a Django atomic block ends in a rollback without raising:
    ``transaction.set_rollback(True)``, and an error of the ORM caught inside the
    block without a savepoint (Django marks the block for rollback; here a
    ``ValueError`` raised by ``save()`` before anything is sent, so PostgreSQL's
    transaction is still healthy and the completion statement succeeds)."""

    @staticmethod
    def set_rollback() -> None:
        transaction.set_rollback(True)

    @staticmethod
    def caught_orm_error() -> None:
        from tests.django_project.shop.models import Order

        # "best effort": Django has marked the block for rollback
        with contextlib.suppress(ValueError):
            Order(pk="not a number", name="x").save()


ROLLBACKS = ["set_rollback", "caught_orm_error"]


@pytest.mark.parametrize("how", ROLLBACKS)
def test_a_job_atomic_block_django_rolls_back_is_not_reported_completed(
    shop: leaseq.Queue,  # noqa: F811
    database_url: str,
    how: str,
) -> None:
    """docs/django.md: job_atomic runs the completion last inside the block, "then
    ``job.mark_completed()`` once it committed". A block Django rolls back at its
    exit (marked for rollback) raised nothing: the completion was rolled back with
    the effect, and still the job was marked completed, so the worker counted it
    done, ran the on_success hooks, stopped renewing its lease and left the job
    running until that lease expired."""
    from leaseq.contrib.django import job_atomic
    from tests.django_project.shop.models import Order

    job_id = shop.enqueue("effects", {"n": 1})
    aqueue = leaseq.AsyncQueue(database_url, schema=shop.schema)  # opens nothing here
    (claim,) = shop.claim("effects", lease=30)
    job = leaseq.JobContext(claim, shop, aqueue)
    with pytest.raises(leaseq.InvalidArgument, match="rollback"), job_atomic(job):
        Order.objects.create(name="effect")
        getattr(_Rollback, how)()
    assert Order.objects.count() == 0
    assert not job.completed
    assert shop.get(job_id).status is JobStatus.RUNNING


def test_drain_counts_no_completion_for_a_job_atomic_block_django_rolled_back(
    shop: leaseq.Queue,  # noqa: F811
    database_url: str,
) -> None:
    """Under the worker (leaseq.testing.drain is the worker): the attempt was counted
    completed and on_success ran, while the job stayed running, unrenewed, with
    neither its effect nor its completion."""
    from leaseq.contrib.django import job_atomic
    from leaseq.contrib.django.worker import django_connections
    from tests.django_project.shop.models import Order

    app = leaseq.App(schema=shop.schema)
    succeeded: list[int] = []

    @app.on_success
    def success(job: leaseq.JobContext, result: object) -> None:
        succeeded.append(job.job_id)

    @app.task("effects", max_attempts=1)
    @django_connections
    def handler(job: leaseq.JobContext) -> None:
        with job_atomic(job):
            Order.objects.create(name="effect")
            transaction.set_rollback(True)

    job_id = shop.enqueue("effects", {"n": 1})
    stats = drain(app, dsn=database_url)
    job = shop.get(job_id)
    assert Order.objects.count() == 0
    assert succeeded == []
    assert stats.completed == 0
    assert job.status is not JobStatus.RUNNING  # nothing holds it: failed, as the error says
    assert job.status is JobStatus.FAILED


def test_a_job_transaction_inside_a_job_atomic_block_is_refused(
    shop: leaseq.Queue,  # noqa: F811
    database_url: str,
) -> None:
    """The same with Django: job.transaction() (or a job_session) inside
    job_atomic completed the job on its own connection; the atomic block's
    Order then rolled back with AlreadyCompleted, and the job was done without it."""
    from leaseq.contrib.django import job_atomic
    from tests.django_project.shop.models import Order

    job_id = shop.enqueue("effects", {"n": 1})
    aqueue = leaseq.AsyncQueue(database_url, schema=shop.schema)
    (claim,) = shop.claim("effects", lease=30)
    job = leaseq.JobContext(claim, shop, aqueue)
    with pytest.raises(leaseq.InvalidArgument, match="already open"), job_atomic(job):
        Order.objects.create(name="effect")
        with job.transaction():
            pass
    assert Order.objects.count() == 0
    assert not job.completed
    assert shop.get(job_id).status is JobStatus.RUNNING
    with (
        pytest.raises(leaseq.InvalidArgument, match="already open"),
        job.transaction(),
        job_atomic(job),
    ):
        Order.objects.create(name="effect")
    assert Order.objects.count() == 0
    assert shop.get(job_id).status is JobStatus.RUNNING


# -- manage.py leaseq_worker: its options as given ---------------------------------


def test_the_worker_command_refuses_a_concurrency_out_of_range(
    django_schema: str,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """docs/django.md: ``--concurrency/-c`` (default ``LEASEQ["CONCURRENCY"]``).
    ``-c 0`` was taken for "not given" and the worker ran 10 jobs at a time (the
    CLI's ``leaseq worker --concurrency 0`` is a usage error); ``-c -3`` ended in a
    traceback of InvalidArgument instead of the command's one-line error."""
    from django.core.management import call_command
    from django.core.management.base import CommandError

    from leaseq.contrib.django.management.commands import leaseq_worker

    started: list[int] = []

    class NotRun(leaseq.Worker):
        async def run(self, **kwargs: Any) -> None:
            started.append(self.concurrency)

    monkeypatch.setattr(leaseq_worker, "Worker", NotRun)
    for given in ("0", "-3"):
        with pytest.raises(CommandError, match="concurrency"):
            call_command("leaseq_worker", "--concurrency", given)
    assert started == []
    call_command("leaseq_worker", "--concurrency", "3")
    assert started == [3]


# -- Django: the app's after hooks use the ORM in threads of their own ----------------

#: settings.LEASEQ["APP"] of the next test: an on_success hook that writes with the ORM.
hooked_app = leaseq.App()
hook_backends: list[int] = []


@hooked_app.task("hooked")
def _hooked(job: leaseq.JobContext) -> None:
    return None


@hooked_app.on_success
def _record_success(job: leaseq.JobContext, result: object) -> None:
    from django.db import connection as django_connection

    from tests.django_project.shop.models import Order

    Order.objects.create(name=f"hook-{job.payload['n']}")
    hook_backends.append(django_connection.connection.info.backend_pid)


def test_the_orm_in_after_hooks_gets_a_working_connection_after_one_was_lost(
    shop: leaseq.Queue,  # noqa: F811
    run_worker: Any,  # noqa: F811
    connect: Any,
) -> None:
    """docs/django.md: the handlers of LEASEQ["APP"] run "between close_old_connections()
    calls, as a request does". Its on_success/on_failure hooks run in threads of
    their own, never between such calls: a hook thread's Django connection, once
    broken (a server restart, a failover, an idle timeout), stayed broken, and
    every later hook that used the ORM failed (logged) until the worker restarted."""
    from django.test.utils import override_settings

    from tests.django_project.shop.models import Order

    hook_backends.clear()
    app_setting = {"SCHEMA": shop.schema, "APP": f"{__name__}:hooked_app"}
    with override_settings(LEASEQ=app_setting):
        shop.enqueue("hooked", {"n": 1})
        run_worker(concurrency=1)
        # (The hook records its backend just after its row commits: wait for both.)
        _until(lambda: Order.objects.filter(name="hook-1").exists() and bool(hook_backends))
        (pid,) = hook_backends
        connect(autocommit=True).execute("SELECT pg_terminate_backend(%s)", (pid,))
        shop.enqueue("hooked", {"n": 2})
        _until(lambda: Order.objects.filter(name="hook-2").exists(), timeout=15)
