"""Django's connection handling around leaseq's writes on Django's connection:
persistent connections (CONN_MAX_AGE) and their health checks, and a database
whose AUTOCOMMIT is off (the application manages its transactions)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

import leaseq
from leaseq import JobStatus

# The Django tests' own fixtures (imported: pytest finds them here).
from .test_contrib_django import django_schema, shop  # noqa: F401

django = pytest.importorskip("django")

from django.db import close_old_connections, connections, transaction  # noqa: E402


@pytest.fixture
def django_settings() -> Iterator[dict[str, Any]]:
    """DATABASES["default"] of the running connection, changed for one test; Django
    reads these keys when it connects, so the connection is closed on both sides."""
    entry: dict[str, Any] = connections["default"].settings_dict
    saved = dict(entry)
    connections["default"].close()
    yield entry
    connections["default"].close()
    entry.clear()
    entry.update(saved)


def _backend_pid() -> int:
    wrapper = connections["default"]
    wrapper.ensure_connection()
    return int(wrapper.connection.info.backend_pid)


def _jobs(queue: leaseq.Queue, name: str) -> int:
    return len(queue.find_jobs(queue=name).jobs)


# -- persistent connections: a connection the server dropped is replaced ----------------


@pytest.mark.parametrize("health_checks", [True, False], ids=["health_checks", "no_checks"])
def test_a_persistent_connection_the_server_dropped_is_replaced_for_the_next_enqueue(
    shop: leaseq.Queue,  # noqa: F811
    django_settings: dict[str, Any],
    connect: Any,
    health_checks: bool,
) -> None:
    """docs/django.md: the job is written on Django's own connection. With
    persistent connections (CONN_MAX_AGE), Django replaces one the server dropped
    (a restart, a failover, an idle timeout) at the next request: at once with
    CONN_HEALTH_CHECKS, else after a query on it failed. leaseq's enqueue skipped
    the health check and its failures went unnoticed by Django: a process whose
    requests (or a worker thread whose jobs) only enqueue failed every enqueue,
    for good, with a connection that was never replaced."""
    from leaseq.contrib.django import enqueue

    django_settings["CONN_MAX_AGE"] = None
    django_settings["CONN_HEALTH_CHECKS"] = health_checks
    close_old_connections()  # a request begins
    enqueue("mails", {"n": 1})
    close_old_connections()  # it ends; the next begins
    pid = _backend_pid()
    connect(autocommit=True).execute("SELECT pg_terminate_backend(%s)", (pid,))
    if not health_checks:
        # Django's own queries fail once too; then Django knows.
        with pytest.raises(leaseq.TransientError):
            enqueue("mails", {"n": 2})
        close_old_connections()
    enqueue("mails", {"n": 3})
    close_old_connections()
    assert _jobs(shop, "mails") == 2
    assert _backend_pid() != pid


# -- AUTOCOMMIT = False: the application commits ------------------------------------------


def test_job_atomic_without_autocommit_reports_no_completion_that_did_not_commit(
    shop: leaseq.Queue,  # noqa: F811
    django_settings: dict[str, Any],
    database_url: str,
) -> None:
    """docs/django.md: job_atomic's effect and completion commit together, then
    ``job.mark_completed()`` "once it committed". With DATABASES' AUTOCOMMIT off,
    Django's outermost atomic() is a savepoint and commits nothing: the block
    returned, the job was marked completed (the worker counts it done, runs its
    on_success hooks, stops renewing the lease), while neither the effect nor the
    completion had committed (rolled back when the connection closed). Whatever
    happens, a job reported completed is done for everyone else, with its effect."""
    from leaseq.contrib.django import job_atomic
    from tests.django_project.shop.models import Order

    django_settings["AUTOCOMMIT"] = False
    job_id = shop.enqueue("effects", {"n": 1})
    aqueue = leaseq.AsyncQueue(database_url, schema=shop.schema)  # opens nothing here
    (claim,) = shop.claim("effects", lease=30)
    job = leaseq.JobContext(claim, shop, aqueue)
    try:
        with job_atomic(job):
            Order.objects.create(name="effect")
    except leaseq.InvalidArgument:
        pass  # refused: then nothing was written
    seen = (shop.get(job_id).status, Order.objects.using("default").count())
    connections["default"].close()  # what close_old_connections() does after the job
    after = (shop.get(job_id).status, _orders(database_url))
    if job.completed:
        assert after == (JobStatus.DONE, 1)
    else:
        assert after == (JobStatus.RUNNING, 0)
        assert seen == (JobStatus.RUNNING, 0)  # refused before anything was written


def test_an_enqueue_without_autocommit_rolls_back_with_the_applications_transaction(
    shop: leaseq.Queue,  # noqa: F811
    django_settings: dict[str, Any],
) -> None:
    """With AUTOCOMMIT off the application commits or rolls back itself
    (transaction.commit() / transaction.rollback()); a job enqueued in its
    transaction must go with it, as its model writes do."""
    from leaseq.contrib.django import enqueue, enqueue_many
    from tests.django_project.shop.models import Order

    django_settings["AUTOCOMMIT"] = False
    shop.configure_queue("mails", max_queued_jobs=100)  # (an enqueue with a limit)
    Order.objects.create(name="dropped")
    enqueue("mails", {"n": 1})
    enqueue_many("mails", [{"n": 2}, {"n": 3}])
    enqueue("mails", {"n": 4}, unique_key="k", unique_for=60)
    transaction.rollback()
    assert (Order.objects.count(), _jobs(shop, "mails")) == (0, 0)
    enqueue("mails", {"n": 5})
    Order.objects.create(name="kept")
    transaction.commit()
    assert (Order.objects.count(), _jobs(shop, "mails")) == (1, 1)


def _orders(database_url: str) -> int:
    import psycopg

    from tests.django_project.shop.models import Order

    table = Order._meta.db_table
    schema = connections["default"].settings_dict["OPTIONS"]["options"].split("=")[-1]
    with psycopg.connect(database_url) as conn:
        row = conn.execute(f'SELECT count(*) FROM "{schema}"."{table}"').fetchone()
    assert row is not None
    return int(row[0])


# -- REPEATABLE READ and SERIALIZABLE: the worker renews the lease during the block -----


@pytest.mark.parametrize("isolation", ["REPEATABLE_READ", "SERIALIZABLE"])
def test_a_job_atomic_block_in_one_snapshot_completes_although_the_lease_was_renewed(
    shop: leaseq.Queue,  # noqa: F811
    django_settings: dict[str, Any],
    database_url: str,
    isolation: str,
) -> None:
    """DATABASES' OPTIONS["isolation_level"] at REPEATABLE READ or SERIALIZABLE: the
    block reads one snapshot, the worker's renewal of the lease changed the job's
    row after it, and the completion failed (a serialization failure, the effect
    rolled back): a block that lasted past a renewal failed on every attempt."""
    from psycopg import IsolationLevel

    from leaseq.contrib.django import job_atomic
    from tests.django_project.shop.models import Order

    django_settings["OPTIONS"] = {
        **django_settings["OPTIONS"],
        "isolation_level": IsolationLevel[isolation],
    }
    job_id = shop.enqueue("effects", {"n": 1})
    aqueue = leaseq.AsyncQueue(database_url, schema=shop.schema)  # opens nothing here
    (claim,) = shop.claim("effects", lease=30)
    job = leaseq.JobContext(claim, shop, aqueue)
    with job_atomic(job):
        assert Order.objects.count() == 0  # the snapshot
        shop.renew_many([claim])  # the worker's heartbeat
        Order.objects.create(name="effect")
    assert (shop.get(job_id).status, job.completed) == (JobStatus.DONE, True)
    assert _orders(database_url) == 1
