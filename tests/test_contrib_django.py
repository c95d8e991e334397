"""leaseq.contrib.django against the real database and real workers.

Django is configured once per test process (``settings.configure``, from
``tests/django_project/settings.py``): its own tables live in a schema of the
session (its connections' search_path), created by ``manage.py migrate``, whose
post_migrate hook also migrates leaseq into it. Each test then points
``settings.LEASEQ["SCHEMA"]`` at its own fresh leaseq schema (``override_settings``).
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import psycopg
import pytest

import leaseq
from leaseq.testing import set_clock_offset

from .conftest import ROOT

django = pytest.importorskip("django")
pytest.importorskip("django_tasks")

from django.conf import settings  # noqa: E402
from django.core.exceptions import ImproperlyConfigured  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.db import connections, transaction  # noqa: E402
from django.db.transaction import TransactionManagementError  # noqa: E402
from django.test.utils import override_settings  # noqa: E402
from django.utils import timezone  # noqa: E402

# The framework's names: django.tasks from Django 6.0, else the django-tasks package.
from leaseq.contrib.django._framework import InvalidTaskError, TaskResultDoesNotExist  # noqa: E402

from .django_project.settings import configuration  # noqa: E402


@pytest.fixture(scope="session")
def django_schema(database_url: str) -> Iterator[str]:
    """Configure Django once in this process; its tables in a schema of the session."""
    name = f"dj_{uuid.uuid4().hex[:16]}"
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{name}"')
    if not settings.configured:
        settings.configure(**configuration(database_url, name, leaseq_schema=name))
        django.setup()
    call_command("migrate", run_syncdb=True, verbosity=0)
    yield name
    connections.close_all()
    from leaseq.contrib.django import close_queues

    close_queues()
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')


@pytest.fixture
def shop(django_schema: str, queue: leaseq.Queue) -> Iterator[leaseq.Queue]:
    """The test's leaseq schema as settings.LEASEQ's; an empty Order table."""
    from tests.django_project.shop.models import Order

    Order.objects.all().delete()
    with override_settings(LEASEQ={"SCHEMA": queue.schema}):
        yield queue
    Order.objects.all().delete()
    connections.close_all()


def _until(condition: Callable[[], bool], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail("condition not reached in time")
        time.sleep(0.05)


class InProcessWorker:
    """``leaseq.Worker`` on ``worker_app()``, on an event loop of its own thread."""

    def __init__(self, concurrency: int = 4) -> None:
        from leaseq.contrib.django import worker_app

        self.worker = leaseq.Worker(
            worker_app(), concurrency=concurrency, poll_interval=0.1, maintenance=False
        )
        self.loop = asyncio.new_event_loop()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            self.loop.run_until_complete(self.worker.run())
        except BaseException as exc:
            self.error = exc
        finally:
            self.loop.close()

    def stop(self) -> None:
        if not self.loop.is_closed():
            self.loop.call_soon_threadsafe(self.worker.request_stop)
        self.thread.join(30)
        assert not self.thread.is_alive()
        assert self.error is None, self.error


@pytest.fixture
def run_worker() -> Iterator[Callable[..., InProcessWorker]]:
    started: list[InProcessWorker] = []

    def start(concurrency: int = 4) -> InProcessWorker:
        started.append(InProcessWorker(concurrency))
        return started[-1]

    yield start
    for worker in started:
        worker.stop()


def _count_jobs(database_url: str, schema: str) -> int:
    with psycopg.connect(database_url) as conn:
        row = conn.execute(f'SELECT count(*) FROM "{schema}".job').fetchone()
    assert row is not None
    return int(row[0])


# -- settings and migrations ---------------------------------------------------------


def test_manage_migrate_also_migrated_leaseq(django_schema: str, database_url: str) -> None:
    """The session's `manage.py migrate` ran leaseq's migrations (post_migrate)."""
    with leaseq.Queue(database_url, schema=django_schema) as queue:
        assert queue.migrate() == []  # already up to date
        assert queue.stats() == []


def test_leaseq_migrate_command(django_schema: str, database_url: str) -> None:
    name = f"t_{uuid.uuid4().hex[:16]}"
    try:
        with override_settings(LEASEQ={"SCHEMA": name}):
            out = _call("leaseq_migrate")
            assert "applied migrations [1, " in out
            assert "is up to date" in _call("leaseq_migrate")
    finally:
        with psycopg.connect(database_url, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')


def _call(command: str) -> str:
    import io

    out = io.StringIO()
    call_command(command, stdout=out)
    return out.getvalue()


def test_the_worker_command_refuses_to_run_nothing(django_schema: str) -> None:
    from django.core.management.base import CommandError

    with override_settings(TASKS={}), pytest.raises(CommandError, match="nothing to run"):
        call_command("leaseq_worker")


def test_settings_are_checked_and_the_dsn_comes_from_databases(django_schema: str) -> None:
    from leaseq.contrib.django import leaseq_settings
    from leaseq.contrib.django.conf import dsn_of

    with override_settings(LEASEQ={"SHCEMA": "x"}), pytest.raises(ImproperlyConfigured):
        leaseq_settings()
    with override_settings(LEASEQ={"DATABASE": "other"}), pytest.raises(ImproperlyConfigured):
        leaseq_settings()
    dsn = dsn_of("default")
    entry = settings.DATABASES["default"]
    assert f"dbname={entry['NAME']}" in dsn
    assert leaseq_settings().dsn() == dsn
    with override_settings(LEASEQ={"DATABASE_URL": "postgresql://elsewhere/db"}):
        assert leaseq_settings().dsn() == "postgresql://elsewhere/db"


# -- enqueue inside transaction.atomic() ---------------------------------------------


def test_enqueue_commits_and_rolls_back_with_the_model_write(shop: leaseq.Queue) -> None:
    from leaseq.contrib.django import enqueue
    from tests.django_project.shop.models import Order

    with transaction.atomic():
        Order.objects.create(name="kept")
        kept = enqueue("orders", {"name": "kept"})

    class Abort(Exception):
        pass

    with pytest.raises(Abort), transaction.atomic():
        Order.objects.create(name="dropped")
        dropped = enqueue("orders", {"name": "dropped"})
        raise Abort

    # The enqueue first in its block: the transaction is Django's from its first
    # statement on (not a transaction of psycopg's committed at once).
    with pytest.raises(Abort), transaction.atomic():
        first = enqueue("orders", {"name": "first"})
        Order.objects.create(name="first")
        raise Abort

    assert list(Order.objects.values_list("name", flat=True)) == ["kept"]
    assert shop.get(kept).payload == {"name": "kept"}
    for job_id in (dropped, first):
        with pytest.raises(leaseq.JobNotFound):
            shop.get(job_id)
    with transaction.atomic():
        from leaseq.contrib.django import connection

        assert connection().info.transaction_status is psycopg.pq.TransactionStatus.INTRANS
    # Outside atomic(): Django's autocommit, the job is there at once.
    at_once = enqueue("orders", {"name": "at once"}, priority=5)
    assert shop.get(at_once).priority == 5
    assert [stats.queued for stats in shop.stats("orders")] == [2]


@pytest.mark.parametrize("batch", [False, True], ids=["enqueue", "enqueue_many"])
def test_a_refusal_caught_inside_atomic_rolls_the_block_back_as_django_knows(
    shop: leaseq.Queue, batch: bool
) -> None:
    """A refusal from the database (BacklogFull, a queue's PayloadTooLarge) aborts
    the transaction; leaseq wrote on the psycopg connection under Django's, so
    Django did not know. A caller who caught it left atomic() normally: the
    server turned the COMMIT into a ROLLBACK (the order gone) and on_commit
    callbacks ran for it. Now Django knows, as for its own failed writes; the
    README's nested atomic() around the enqueue keeps the rest of the block."""
    from leaseq.contrib.django import enqueue, enqueue_many
    from tests.django_project.shop.models import Order

    def refused_enqueue() -> None:
        if batch:
            enqueue_many("orders", [{"pad": "x" * 100}])
        else:
            enqueue("orders", {"pad": "x" * 100})

    shop.configure_queue("orders", max_payload_bytes=16)
    confirmed: list[str] = []
    with pytest.raises(TransactionManagementError), transaction.atomic():
        Order.objects.create(name="lost")
        transaction.on_commit(lambda: confirmed.append("lost"))
        with pytest.raises(leaseq.PayloadTooLarge):
            refused_enqueue()
        Order.objects.create(name="after the refusal")  # Django refuses: the block failed
    with transaction.atomic():
        Order.objects.create(name="kept")
        transaction.on_commit(lambda: confirmed.append("kept"))
        with pytest.raises(leaseq.PayloadTooLarge), transaction.atomic():
            refused_enqueue()
    assert confirmed == ["kept"]
    assert list(Order.objects.values_list("name", flat=True)) == ["kept"]
    # A refusal before anything was sent leaves the transaction as it was.
    with transaction.atomic():
        Order.objects.create(name="also kept")
        with pytest.raises(leaseq.InvalidJob):
            enqueue("orders", {"bad": float("nan")})
    assert Order.objects.filter(name="also kept").exists()


def test_enqueue_many_takes_the_batch_arguments_of_queue_enqueue_many(
    shop: leaseq.Queue,
) -> None:
    """docs/django.md: it takes leaseq.Queue's arguments; keys, seqs, unique keys
    and timeouts were refused with a TypeError."""
    from leaseq.contrib.django import enqueue_many

    with transaction.atomic():
        ordered = enqueue_many("orders", [{"n": 1}, {"n": 2}], key="customer-7", seqs=[2, 1])
        unique = enqueue_many(
            "orders", [{"n": 3}, {"n": 4}], unique_keys=["a", "a"], unique_for=60, timeout=5
        )
    assert [shop.get(job_id).seq for job_id in ordered] == [2, 1]
    assert {shop.get(job_id).key for job_id in ordered} == {"customer-7"}
    assert unique[0] == unique[1]
    assert unique.existing == (False, True)
    assert shop.get(unique[0]).timeout == 5


def test_a_plain_handler_completes_in_the_same_transaction(
    shop: leaseq.Queue, run_worker: Callable[..., InProcessWorker]
) -> None:
    """LEASEQ["APP"]'s handler (tests/django_project/shop/jobs.py) under the worker of
    worker_app(): its Order and its completion commit together."""
    from leaseq.contrib.django import enqueue
    from tests.django_project.shop.models import Order

    with override_settings(
        LEASEQ={"SCHEMA": shop.schema, "APP": "tests.django_project.shop.jobs:app"}
    ):
        with transaction.atomic():
            job_id = enqueue("orders", {"name": "by the worker"})
        worker = run_worker()
        assert set(worker.worker.queues) == {"orders", "default", "emails"}
        result = shop.wait_result(job_id, timeout=30, poll_interval=0.1)
    (order,) = Order.objects.all()
    assert result == {"order": order.pk}
    assert order.name == "by the worker"


# -- job_atomic: the effect and the completion in one transaction ---------------------


def test_job_atomic_commits_the_effect_with_the_completion_and_a_lost_lease_neither(
    shop: leaseq.Queue, database_url: str
) -> None:
    from leaseq.contrib.django import job_atomic
    from tests.django_project.shop.models import Order

    job_id = shop.enqueue("effects", {"n": 1})
    aqueue = leaseq.AsyncQueue(database_url, schema=shop.schema)  # opens nothing here
    (claim,) = shop.claim("effects", lease=30)
    job = leaseq.JobContext(claim, shop, aqueue)

    class Abort(Exception):
        pass

    with pytest.raises(Abort), job_atomic(job):
        Order.objects.create(name="effect")
        raise Abort  # neither the effect nor the completion
    assert Order.objects.count() == 0
    assert shop.get(job_id).status is leaseq.JobStatus.RUNNING

    with pytest.raises(leaseq.LeaseLost), job_atomic(job):
        Order.objects.create(name="effect")
        set_clock_offset(shop, 60)  # past the lease: another worker may hold it now
    assert Order.objects.count() == 0
    assert not job.completed

    (again,) = shop.claim("effects", lease=30)  # the expired lease, recovered
    assert again.job_id == job_id
    rerun = leaseq.JobContext(again, shop, aqueue)
    with job_atomic(rerun):
        Order.objects.create(name="effect")
        rerun.result = {"orders": 1}
    assert rerun.completed
    # The same attempt's block again (a retried transaction): refused, rolled back.
    with pytest.raises(leaseq.AlreadyCompleted), job_atomic(rerun):
        Order.objects.create(name="effect")

    # A durable block: nested in another atomic() it would report a
    # completion the outer block could still roll back.
    with pytest.raises(RuntimeError), transaction.atomic(), job_atomic(rerun):
        pass
    assert list(Order.objects.values_list("name", flat=True)) == ["effect"]
    assert shop.get(job_id).status is leaseq.JobStatus.DONE
    assert shop.result(job_id) == {"orders": 1}


# -- Django's task framework -----------------------------------------------------------


def test_tasks_run_on_a_real_worker_with_their_results(
    shop: leaseq.Queue, run_worker: Callable[..., InProcessWorker]
) -> None:
    from leaseq.contrib.django.tasks import LeaseqBackend
    from tests.django_project.shop import tasks
    from tests.django_project.shop.models import Order

    backend = tasks.add.get_backend()
    assert isinstance(backend, LeaseqBackend)
    with transaction.atomic():
        added = tasks.add.enqueue(2, b=3)
        placed = tasks.place_order.enqueue("book")
        doubled = tasks.double.enqueue(21)
    assert added.status == "READY"
    assert backend.get_result(added.id).status == "READY"
    assert shop.get(int(added.id)).payload == {
        "task": "tests.django_project.shop.tasks.add",
        "args": [2],
        "kwargs": {"b": 3},
        "backend": "default",
        "priority": 0,
    }
    run_worker()
    for result in (added, placed, doubled):
        _until(lambda result=result: _refreshed(result).is_finished)
    assert added.status == "SUCCESSFUL"
    assert added.return_value == 5
    assert added.attempts == 1
    assert added.finished_at is not None
    assert added.enqueued_at is not None
    (order,) = Order.objects.all()
    assert placed.return_value == {"order": order.pk, "attempt": 1, "id": placed.id}
    assert doubled.return_value == 42
    fetched = tasks.add.get_result(added.id)
    assert (fetched.status, fetched.return_value, fetched.args) == ("SUCCESSFUL", 5, [2])

    async def from_async_code() -> Any:
        result = await tasks.add.aenqueue(20, 22)
        _until(lambda: shop.get(int(result.id)).status.finished)
        await result.arefresh()
        return result

    late = asyncio.run(from_async_code())
    assert (late.status, late.return_value) == ("SUCCESSFUL", 42)


def _refreshed(result: Any) -> Any:
    result.refresh()
    return result


def test_priority_and_run_after_are_honoured(
    shop: leaseq.Queue, run_worker: Callable[..., InProcessWorker]
) -> None:
    from leaseq.contrib.django._framework import task_finished, task_started
    from tests.django_project.shop import tasks
    from tests.django_project.shop.models import Order

    seen: list[tuple[str, int]] = []

    def started(sender: Any, task_result: Any, **_: Any) -> None:
        seen.append(("started", task_result.task.priority))

    def finished(sender: Any, task_result: Any, **_: Any) -> None:
        seen.append(("finished", task_result.task.priority))

    task_started.connect(started)
    task_finished.connect(finished)
    later = tasks.record.using(run_after=timezone.now() + timedelta(hours=1)).enqueue("later")
    low = tasks.record.using(priority=-10).enqueue("low")
    mid = tasks.record.enqueue("mid")
    high = tasks.record.using(priority=50).enqueue("high")
    assert shop.get(int(high.id)).priority == 50
    assert later.task.run_after is not None
    assert shop.get(int(later.id)).available_at == later.task.run_after
    run_worker(concurrency=1)
    for result in (low, mid, high):
        _until(lambda result=result: _refreshed(result).status == "SUCCESSFUL")
    assert list(Order.objects.order_by("pk").values_list("name", flat=True)) == [
        "high",
        "mid",
        "low",
    ]
    task_started.disconnect(started)
    task_finished.disconnect(finished)
    # The worker's signals see each task as it was enqueued (.using(priority=...)).
    assert seen == [(event, p) for p in (50, 0, -10) for event in ("started", "finished")]
    time.sleep(0.5)  # the worker polls every 0.1 s: the deferred task is not due
    assert _refreshed(later).status == "READY"
    set_clock_offset(shop, 3600 + 60)
    _until(lambda: _refreshed(later).status == "SUCCESSFUL")
    assert Order.objects.filter(name="later").count() == 1


def test_a_failing_task_ends_failed_with_its_error(
    shop: leaseq.Queue, run_worker: Callable[..., InProcessWorker]
) -> None:
    from tests.django_project.shop import tasks

    failed = tasks.fail.enqueue("out of paper")
    run_worker()
    _until(lambda: _refreshed(failed).is_finished)
    assert failed.status == "FAILED"
    (error,) = failed.errors
    assert error.exception_class is ValueError
    # The message is the task's argument: masked, as any payload value (contract 7).
    assert "builtins.ValueError: ***\n" in error.traceback
    assert "out of paper" not in error.traceback
    assert "Traceback (most recent call last)" in error.traceback
    with pytest.raises(ValueError, match="failed"):
        _ = failed.return_value
    job = shop.get(int(failed.id))
    assert (job.status, job.queue) == (leaseq.JobStatus.FAILED, "emails")


def test_a_task_whose_return_value_is_not_json_is_finished_as_failed(
    shop: leaseq.Queue, run_worker: Callable[..., InProcessWorker]
) -> None:
    """task_finished said SUCCESSFUL for a task whose job then failed (its return
    value cannot be stored: InvalidResult), as Django's own backends do not."""
    from leaseq.contrib.django._framework import task_finished
    from tests.django_project.shop import tasks

    finished: list[str] = []

    def record(sender: Any, task_result: Any, **_: Any) -> None:
        finished.append(str(task_result.status))

    task_finished.connect(record)
    try:
        result = tasks.returns_a_set.enqueue()
        run_worker()
        _until(lambda: _refreshed(result).is_finished)
    finally:
        task_finished.disconnect(record)
    assert result.status == "FAILED"
    assert finished == [str(result.status)]
    job = shop.get(int(result.id))
    assert (job.status, job.attempts) == (leaseq.JobStatus.FAILED, 1)
    assert "InvalidResult" in (job.last_error or "")


def test_an_attempt_past_its_timeout_is_finished_as_failed(
    shop: leaseq.Queue, run_worker: Callable[..., InProcessWorker]
) -> None:
    """task_finished said SUCCESSFUL for an attempt that outlived its timeout: the
    task returned, but its job was retried (its return never acknowledged)."""
    from leaseq.contrib.django._framework import task_finished
    from tests.django_project.shop import tasks

    timed = {
        "BACKEND": "leaseq.contrib.django.tasks.LeaseqBackend",
        "OPTIONS": {"MAX_ATTEMPTS": 1, "TIMEOUT": 0.5},
    }
    finished: list[str] = []

    def record(sender: Any, task_result: Any, **_: Any) -> None:
        finished.append(str(task_result.status))

    task_finished.connect(record)
    try:
        with override_settings(TASKS={**settings.TASKS, "timed": timed}):
            result = tasks.slow.using(backend="timed").enqueue(1.5)
            run_worker()
            _until(lambda: _refreshed(result).is_finished)
            _until(lambda: bool(finished))
    finally:
        task_finished.disconnect(record)
    assert result.status == "FAILED"
    assert finished == ["FAILED"]
    assert "timed out" in (shop.get(int(result.id)).last_error or "")


def test_a_task_is_retried_up_to_its_attempts_with_one_error_each(
    shop: leaseq.Queue, run_worker: Callable[..., InProcessWorker]
) -> None:
    from leaseq.contrib.django._framework import task_backends
    from tests.django_project.shop import tasks

    retrying = {
        "BACKEND": "leaseq.contrib.django.tasks.LeaseqBackend",
        "QUEUES": ["emails"],
        "OPTIONS": {"MAX_ATTEMPTS": 2},
    }
    with override_settings(TASKS={**settings.TASKS, "retrying": retrying}):
        shop.configure_queue("emails", backoff_base=0, backoff_cap=0)
        failed = tasks.fail.using(backend="retrying").enqueue("jammed")
        assert shop.get(int(failed.id)).max_attempts == 2
        run_worker()
        _until(lambda: _refreshed(failed).is_finished)
        assert failed.status == "FAILED"
        assert failed.attempts == 2
        assert [error.exception_class for error in failed.errors] == [ValueError, ValueError]
        with pytest.raises(TaskResultDoesNotExist):  # not a task of the default backend
            task_backends["default"].get_result(failed.id)


def test_cancelled_task_is_failed(shop: leaseq.Queue) -> None:
    from tests.django_project.shop import tasks

    result = tasks.add.enqueue(1, 1)
    assert shop.cancel(int(result.id))
    result.refresh()
    assert result.status == "FAILED"
    assert result.errors


def test_bad_tasks_and_arguments_are_refused_and_write_nothing(
    shop: leaseq.Queue, database_url: str
) -> None:
    from tests.django_project.shop import tasks

    with pytest.raises(InvalidTaskError, match="not valid"):
        tasks.add.using(queue_name="not-configured").enqueue(1, 2)
    with (
        override_settings(TASKS={"default": {**settings.TASKS["default"], "QUEUES": []}}),
        pytest.raises(InvalidTaskError, match="queue name"),
    ):
        tasks.add.using(queue_name="no spaces allowed").enqueue(1, 2)
    with pytest.raises(TypeError, match="JSON"):
        tasks.add.enqueue(object(), 2)
    with pytest.raises(TypeError, match="JSON"):
        tasks.add.enqueue(1, b=float("nan"))
    # Keys JSON makes one: the round trip kept one value of the two, silently.
    with pytest.raises(TypeError, match="same JSON text"):
        tasks.add.enqueue({1: "int key", "1": "str key"}, 2)
    with pytest.raises(TypeError, match="same JSON text"):
        tasks.add.enqueue(1, b=[{"x": {True: 1, "true": 2}}])
    with pytest.raises(InvalidTaskError, match="priority"):
        tasks.add.using(priority=101)
    assert _count_jobs(database_url, shop.schema) == 0
    backend = tasks.add.get_backend()
    for missing in ("12345", "not-a-number", "0", "-1", "9" * 23):
        with pytest.raises(TaskResultDoesNotExist):
            backend.get_result(missing)
    plain = shop.enqueue("default", {"not": "a task"})
    with pytest.raises(TaskResultDoesNotExist):
        backend.get_result(str(plain))
    with pytest.raises(ImproperlyConfigured, match="QUEUES"):
        type(backend)("bad", {"QUEUES": ["no spaces allowed"]})
    for options in ({"RETRIES": 3}, {"MAX_ATTEMPTS": 0}, {"TIMEOUT": "1h"}):
        with pytest.raises(ImproperlyConfigured, match="OPTIONS"):
            type(backend)("bad", {"OPTIONS": options})


def test_arguments_nested_past_what_json_encodes_are_refused_as_the_others(
    shop: leaseq.Queue, database_url: str
) -> None:
    """Arguments nested thousands deep: the round trip through JSON raised a bare
    RecursionError (no TypeError like any other argument JSON cannot take); and
    arguments nested past leaseq's bound are refused by the task framework's
    error, not written."""
    from tests.django_project.shop import tasks

    deep: Any = 0
    for _ in range(5000):
        deep = [deep]
    with pytest.raises(TypeError, match="JSON"):
        tasks.add.enqueue(deep, 2)
    nested: Any = 0
    for _ in range(300):
        nested = [nested]
    with pytest.raises(InvalidTaskError, match="nests deeper"):
        tasks.add.enqueue(1, b=nested)
    assert _count_jobs(database_url, shop.schema) == 0


def test_a_task_enqueued_in_a_rolled_back_block_is_not_there(shop: leaseq.Queue) -> None:
    from tests.django_project.shop import tasks
    from tests.django_project.shop.models import Order

    class Abort(Exception):
        pass

    with pytest.raises(Abort), transaction.atomic():
        result = tasks.add.enqueue(1, 2)
        Order.objects.create(name="dropped")
        raise Abort
    assert Order.objects.count() == 0
    with pytest.raises(leaseq.JobNotFound):
        shop.get(int(result.id))


def test_a_task_result_is_seen_inside_the_block_that_enqueued_it(shop: leaseq.Queue) -> None:
    """Django's framework hands back a result whose id the caller may look up at
    once: inside the atomic() block that enqueued the task, the lookup must see
    the task (as the block's own ORM reads see its rows), not say it does not
    exist; and a lookup must not make the task visible before the block commits,
    nor keep it after the block rolls back."""
    from tests.django_project.shop import tasks

    class Abort(Exception):
        pass

    backend = tasks.add.get_backend()
    with transaction.atomic():
        added = tasks.add.enqueue(1, 2)
        assert backend.get_result(added.id).status == "READY"
        added.refresh()
        assert added.status == "READY"
        assert tasks.add.get_result(added.id).args == [1, 2]
        with pytest.raises(leaseq.JobNotFound):
            shop.get(int(added.id))  # another connection: not committed yet
    assert backend.get_result(added.id).status == "READY"
    with pytest.raises(Abort), transaction.atomic():
        dropped = tasks.add.enqueue(3, 4)
        assert backend.get_result(dropped.id).kwargs == {}
        raise Abort
    with pytest.raises(TaskResultDoesNotExist):
        backend.get_result(dropped.id)


def test_the_worker_command_runs_tasks(
    shop: leaseq.Queue, django_schema: str, database_url: str
) -> None:
    """`python -m django leaseq_worker` in a subprocess, stopped by SIGTERM to its PID."""
    from tests.django_project.shop import tasks

    results = [tasks.add.enqueue(n, n) for n in range(5)]
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.django_project.settings",
        "LEASEQ_TEST_DATABASE_URL": database_url,
        "LEASEQ_TEST_APP_SCHEMA": django_schema,
        "LEASEQ_TEST_SCHEMA": shop.schema,
        "PYTHONPATH": str(ROOT),
    }
    process = subprocess.Popen(
        [sys.executable, "-m", "django", "leaseq_worker", "--concurrency", "2"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        for result in results:
            _until(
                lambda result=result: _refreshed(result).is_finished or process.poll() is not None
            )
        assert process.poll() is None, process.communicate()
        assert [result.return_value for result in results] == [0, 2, 4, 6, 8]
        process.send_signal(signal.SIGTERM)
        out, err = process.communicate(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert process.returncode == 0, err
    assert "leaseq worker: queues default, emails" in out


# -- the README's example -------------------------------------------------------------


def test_readme_django_example_runs(django_schema: str, database_url: str, schema: str) -> None:
    readme = (ROOT / "README.md").read_text()
    match = re.search(r"<!-- example: django -->\s*```python\n(.*?)```", readme, flags=re.DOTALL)
    assert match is not None, "README.md has no Django example"
    code = match.group(1)
    database = configuration(database_url, schema, schema)["DATABASES"]["default"]
    placeholder = '{"ENGINE": "django.db.backends.postgresql", "NAME": "shop"}'
    assert placeholder in code
    code = code.replace(placeholder, repr(database))
    code = code.replace('LEASEQ={"SCHEMA": "leaseq"}', f'LEASEQ={{"SCHEMA": "{schema}"}}')
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')  # the search_path of its Django connection
    result = subprocess.run(
        [sys.executable, "-c", code],
        env={k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split()[-2:] == ["queued", "READY"]
    assert _count_jobs(database_url, schema) == 2
