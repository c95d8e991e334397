"""A worker whose clock is hours off behaves exactly like one whose clock is right.

time-machine moves this process's clocks (time.time, datetime.now, ...); leaseq
must not care, because every lease and delay is computed by the database.
"""

from __future__ import annotations

import datetime as dt

import pytest
import time_machine

from leaseq import JobStatus, LeaseLost

from .clients import Client
from .conftest import Clock


def _database_now(client: Client) -> dt.datetime:
    with client.connection() as conn:
        row = conn.execute("SELECT statement_timestamp()").fetchone()
    assert row is not None
    now: dt.datetime = row[0]
    return now


@pytest.mark.parametrize("skew_hours", [-7, 0, 5])
def test_leases_and_delays_ignore_the_workers_clock(
    client: Client, clock: Clock, skew_hours: int
) -> None:
    real_now = dt.datetime.now(dt.UTC)
    with time_machine.travel(real_now + dt.timedelta(hours=skew_hours), tick=True):
        assert abs((dt.datetime.now(dt.UTC) - real_now).total_seconds() - skew_hours * 3600) < 60
        delayed = client.enqueue("reports", {"n": 1}, delay=30)
        ready = client.enqueue("reports", {"n": 2})
        (claim,) = client.claim("reports", lease=60)
        assert claim.job_id == ready
        offset = (claim.lease_until - _database_now(client)).total_seconds()
        assert 55 < offset <= 60
        until = client.renew(claim, lease=60)
        assert 55 < (until - _database_now(client)).total_seconds() <= 60
        client.complete(claim)
        assert client.claim("reports") == []  # the delayed job is not due
        clock.advance(31)
        (late,) = client.claim("reports", lease=10)
        assert late.job_id == delayed
        clock.advance(11)
        with pytest.raises(LeaseLost):
            client.complete(late)
        assert client.get(delayed).status is JobStatus.RUNNING  # expired, awaiting recovery


def test_run_at_is_an_absolute_time_checked_by_the_database(client: Client) -> None:
    soon = _database_now(client) + dt.timedelta(seconds=45)
    with time_machine.travel(soon + dt.timedelta(hours=3), tick=True):
        job_id = client.enqueue("reports", {}, run_at=soon)
        assert client.claim("reports") == []  # the worker thinks it is due; the database does not
    assert client.get(job_id).available_at == soon
