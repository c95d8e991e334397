"""Helpers for the tests of code that uses leaseq (and for leaseq's own tests).

* :func:`drain` / :func:`adrain`: run an app's handlers, in the test's own
  process, on every job claimable now, until none is left and none runs. It is
  the worker itself (:meth:`leaseq.Worker.run` in burst mode): the same claim,
  the same fenced acknowledgements, the same retry and failure handling, the
  same hooks; only its listener, its maintenance, its periodic jobs and its
  metrics are off.
* :func:`enqueued` / :func:`aenqueued`: the jobs of a queue, oldest first, for
  assertions on what the code under test enqueued.
* :func:`set_clock_offset` / :func:`aset_clock_offset`: move the schema's clock,
  so that a retry's backoff, a delayed job or an expired lease come due without
  sleeping.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

from ._async_client import AsyncQueue
from ._errors import InvalidArgument
from ._sync_client import Queue
from ._types import Job, JobPage, JobStatus
from ._validate import seconds
from ._worker import App, Worker, WorkerStats

__all__ = [
    "WorkerStats",
    "adrain",
    "aenqueued",
    "aset_clock_offset",
    "drain",
    "enqueued",
    "set_clock_offset",
]

#: find_jobs' largest page and search window: enqueued() reads pages of this many jobs.
_PAGE = 1000
_WINDOW = 1_000_000


def drain(
    app: App,
    *,
    queues: Iterable[str] | None = None,
    dsn: str | None = None,
    concurrency: int = 1,
    timeout: float = 60.0,
) -> WorkerStats:
    """Run ``app``'s handlers on every job of ``queues`` (default: all of the app's)
    claimable now, until none is left and none runs; return what was done.

    Jobs that wait stay queued (a retry's backoff, ``enqueue(delay=...)``): move
    the clock with :func:`set_clock_offset` and drain again. A handler's
    exception is the job's outcome, as under a worker (retried or failed, its
    error in the job's ``last_error``), not raised here. Past ``timeout``
    seconds (a handler that never returns) raises ``TimeoutError``. Call
    :func:`adrain` from async code: this one runs an event loop of its own.
    """
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        pass
    else:
        raise RuntimeError("drain() cannot run inside an event loop: await adrain() instead")
    return asyncio.run(
        adrain(app, queues=queues, dsn=dsn, concurrency=concurrency, timeout=timeout)
    )


async def adrain(
    app: App,
    *,
    queues: Iterable[str] | None = None,
    dsn: str | None = None,
    concurrency: int = 1,
    timeout: float = 60.0,
) -> WorkerStats:
    """The async twin of :func:`drain`, for async tests."""
    # (A week at most: a drain longer than that is a unit mistake.)
    seconds(timeout, "timeout", 7 * 86400.0, allow_zero=False)
    worker = Worker(
        app,
        dsn=dsn,
        queues=queues,
        concurrency=concurrency,
        listen=False,
        maintenance=False,
        metrics=None,
    )
    try:
        async with asyncio.timeout(timeout):
            await worker.run(burst=True)
    except TimeoutError:
        raise TimeoutError(
            f"drain: jobs still ran after {timeout:g}s ({worker.stats}); a handler never returned?"
        ) from None
    return worker.stats


def enqueued(
    queue: Queue, name: str | None = None, *, status: JobStatus | str | None = "queued"
) -> list[Job]:
    """The jobs of queue ``name`` (None: every queue) in ``status`` (None: any),
    oldest first: what the code under test enqueued (all of them, read a page at
    a time)."""
    _require(queue, Queue, "aenqueued")
    found: list[Job] = []
    before: int | None = None
    top: int | None = None
    while True:
        page = queue.find_jobs(
            queue=name, status=status, before=before, window_top=top, limit=_PAGE, window=_WINDOW
        )
        if (more := _more(found, page)) is None:
            return sorted(found, key=lambda job: job.job_id)
        before, top = more


async def aenqueued(
    queue: AsyncQueue, name: str | None = None, *, status: JobStatus | str | None = "queued"
) -> list[Job]:
    """The async twin of :func:`enqueued`."""
    _require(queue, AsyncQueue, "enqueued")
    found: list[Job] = []
    before: int | None = None
    top: int | None = None
    while True:
        page = await queue.find_jobs(
            queue=name, status=status, before=before, window_top=top, limit=_PAGE, window=_WINDOW
        )
        if (more := _more(found, page)) is None:
            return sorted(found, key=lambda job: job.job_id)
        before, top = more


def _more(found: list[Job], page: JobPage) -> tuple[int, int | None] | None:
    """Add ``page``'s jobs to ``found``; the ``before`` and ``window_top`` of the
    next page, or None after the last. (One page alone is the newest jobs: a
    list cut there would start at some later job, silently.)"""
    found += page.jobs
    if page.next_before is None:
        return None
    return page.next_before, page.window_top


def set_clock_offset(queue: Queue, offset_seconds: float) -> None:
    """Move the schema's clock ``offset_seconds`` ahead of the server's time.

    Every lease, delay and expiry in leaseq reads this clock, so a test can
    expire a lease or reach a delayed job without sleeping. The offset is
    absolute (not cumulative) and applies to every connection at once.
    """
    _require(queue, Queue, "aset_clock_offset")
    queue._db.run(queue._store.set_clock_offset(offset_seconds))


async def aset_clock_offset(queue: AsyncQueue, offset_seconds: float) -> None:
    """The async twin of :func:`set_clock_offset`."""
    _require(queue, AsyncQueue, "set_clock_offset")
    await queue._db.run(queue._store.set_clock_offset(offset_seconds))


def _require(queue: object, kind: type[Queue | AsyncQueue], twin: str) -> None:
    """A client of the helper's kind, else InvalidArgument naming the helper for
    the other kind: an AsyncQueue given to ``set_clock_offset`` did nothing at
    all (its coroutine never awaited), a Queue given to ``aset_clock_offset``
    failed with a TypeError after it had moved the clock."""
    if not isinstance(queue, kind):
        raise InvalidArgument(
            f"expected a leaseq.{kind.__name__}, got {type(queue).__name__}"
            + (f": use {twin}()" if isinstance(queue, Queue | AsyncQueue) else "")
        )
