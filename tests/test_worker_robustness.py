"""The worker under adversity: poisoned outcomes, handlers' own timeouts, locked rows,
partitions, starved pools, sync threads that outlive their attempt, group signals."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

import leaseq
from leaseq import JobStatus
from leaseq.worker.outcomes import Kind, Outcomes

from .conftest import ROOT
from .test_worker import Running, _all_finished, _until
from .test_worker_processes import _attempts_logged, _wait, setup_tables  # noqa: F401

def _app(schema: str) -> leaseq.App:
    return leaseq.App(schema=schema)


# -- 3. one bad outcome must not sink the whole flush ------------------------------------


async def test_an_invalid_retry_delay_fails_its_own_job_and_sinks_nothing_else(
    aqueue: leaseq.AsyncQueue, database_url: str, schema: str
) -> None:
    app = _app(schema)
    together = asyncio.Barrier(3)  # all three first attempts finish in one flush

    class Unprintable(Exception):
        def __str__(self) -> str:
            raise RuntimeError("no text for you")

    @app.task("work", max_attempts=2, backoff=(0, 0))
    async def handler(job: leaseq.JobContext) -> None:
        if job.attempts == 1:
            await together.wait()
        kind = job.payload["kind"]
        if kind == "bad-delay":
            job.retry(delay=-1)
        if kind == "unprintable":
            raise Unprintable()
        raise RuntimeError("upstream broke")

    ids = {k: await aqueue.enqueue("work", {"kind": k})
           for k in ("bad-delay", "unprintable", "error")}  # fmt: skip
    running = Running(leaseq.Worker(app, dsn=database_url, concurrency=3, poll_interval=0.1))
    await _until(lambda: _all_finished(aqueue, "work"), timeout=15)
    await running.stop()
    bad = await aqueue.get(ids["bad-delay"])
    assert (bad.status, bad.attempts) == (JobStatus.FAILED, 1)  # InvalidArgument is permanent
    assert (bad.last_error or "").startswith("InvalidArgument: delay must be >= 0")
    unprintable = await aqueue.get(ids["unprintable"])
    assert (unprintable.status, unprintable.attempts) == (JobStatus.FAILED, 2)
    assert unprintable.history[0]["outcome"] == "retry"
    assert (unprintable.last_error or "").startswith("Unprintable")
    error = await aqueue.get(ids["error"])
    assert (error.status, error.attempts) == (JobStatus.FAILED, 2)
    assert error.history[0]["outcome"] == "retry"
    assert error.history[0]["error"] == error.last_error == "RuntimeError: upstream broke"


def test_retry_requests_are_checked_where_they_are_made() -> None:
    with pytest.raises(leaseq.InvalidArgument, match="delay"):
        leaseq.Retry(delay=-1)
    with pytest.raises(leaseq.InvalidArgument, match="delay"):
        leaseq.Retry(delay=float("nan"))
    assert leaseq.Retry(delay=2.5).delay == 2.5
    assert leaseq.Retry().delay is None
    with pytest.raises(leaseq.InvalidArgument, match="backoff cap"):
        leaseq.Backoff(0, 1e12)  # its delays would be refused by every retry


async def test_a_poisoned_outcome_is_reported_on_its_own_job_and_the_batch_lands(
    aqueue: leaseq.AsyncQueue,
) -> None:
    ids = await aqueue.enqueue_many("work", [{"n": n} for n in range(3)])
    first, poisoned, last = await aqueue.claim("work", limit=3)
    outcomes = Outcomes(aqueue)
    flusher = asyncio.create_task(outcomes.run())
    try:
        results = await asyncio.wait_for(
            asyncio.gather(
                outcomes.report(Kind.RETRY, first, delay=0, error="first"),
                outcomes.report(Kind.RETRY, poisoned, delay=-1, error="second"),  # bypasses Retry
                outcomes.report(Kind.RETRY, last, delay=0, error="third"),
                return_exceptions=True,
            ),
            20,
        )
    finally:
        flusher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await flusher
    assert results[0] is True
    assert results[2] is True
    assert isinstance(results[1], leaseq.InvalidArgument)
    jobs = [await aqueue.get(i) for i in ids]
    assert [j.status for j in jobs] == [JobStatus.QUEUED, JobStatus.RUNNING, JobStatus.QUEUED]
    assert [jobs[0].last_error, jobs[2].last_error] == ["first", "third"]
