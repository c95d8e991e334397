"""When the worker claims: only for queues that may have work, never an empty
claim per finished job, and never later than the poll for work no one announces."""

from __future__ import annotations

import asyncio
import time

import pytest

import leaseq
from leaseq._worker.hints import WorkHints

from .test_worker import Running, _all_finished, _until

#: Longer than any test here: a job that waits for the poll fails its test.
NO_POLL = 600.0


@pytest.mark.asyncio
async def test_an_idle_worker_sends_one_claim_per_announced_job(
    aqueue: leaseq.AsyncQueue, database_url: str, schema: str
) -> None:
    """Jobs enqueued one at a time into an idle worker: each notification costs
    one claim, and neither the handler's return nor its acknowledgement sends an
    empty one."""
    app = leaseq.App(schema=schema)
    done: list[int] = []

    @app.task("reports")
    async def handler(job: leaseq.JobContext) -> None:
        done.append(job.job_id)

    worker = leaseq.Worker(
        app, dsn=database_url, concurrency=10, poll_interval=NO_POLL, maintenance=False
    )
    running = Running(worker)
    await _until(lambda: asyncio.sleep(0, worker.stats.claim_statements >= 1))
    await asyncio.sleep(0.3)  # the listener is up (a startup claim found nothing)
    before = worker.stats.claim_statements
    jobs = 20
    for n in range(jobs):
        await aqueue.enqueue("reports", {"n": n})
        await _until(lambda n=n: asyncio.sleep(0, len(done) > n))
        await _until(lambda: _all_finished(aqueue, "reports"))
    await running.stop()
    assert len(done) == jobs
    # One per job; a little slack for a reconnect of the listener.
    assert worker.stats.claim_statements - before <= jobs + 2, worker.stats


@pytest.mark.asyncio
async def test_a_keyed_jobs_successor_starts_without_waiting_for_the_poll(
    aqueue: leaseq.AsyncQueue, database_url: str, schema: str
) -> None:
    """The claim that took a key's head came back short (its successors wait):
    the head's end is what makes the next one claimable, and the worker claims
    for it at once."""
    app = leaseq.App(schema=schema)
    order: list[int] = []

    @app.task("invoices")
    async def handler(job: leaseq.JobContext) -> None:
        order.append(job.payload["n"])

    await aqueue.enqueue_many("invoices", [{"n": n} for n in range(5)], key="customer-7")
    running = Running(leaseq.Worker(app, dsn=database_url, concurrency=4, poll_interval=NO_POLL))
    started = time.monotonic()
    await _until(lambda: _all_finished(aqueue, "invoices"))
    await running.stop()
    assert order == [0, 1, 2, 3, 4]
    assert time.monotonic() - started < NO_POLL / 10


@pytest.mark.asyncio
async def test_a_job_retried_without_delay_runs_again_without_waiting_for_the_poll(
    aqueue: leaseq.AsyncQueue, database_url: str, schema: str
) -> None:
    app = leaseq.App(schema=schema)
    attempts: list[int] = []

    @app.task("reports")
    async def handler(job: leaseq.JobContext) -> None:
        attempts.append(job.attempts)
        if job.attempts < 3:
            raise leaseq.Retry(delay=0)

    await aqueue.enqueue("reports", {})
    running = Running(leaseq.Worker(app, dsn=database_url, concurrency=2, poll_interval=NO_POLL))
    await _until(lambda: _all_finished(aqueue, "reports"))
    await running.stop()
    assert attempts == [1, 2, 3]


@pytest.mark.asyncio
async def test_without_listen_the_poll_finds_new_jobs(
    aqueue: leaseq.AsyncQueue, database_url: str, schema: str
) -> None:
    app = leaseq.App(schema=schema)
    done: list[int] = []

    @app.task("reports")
    async def handler(job: leaseq.JobContext) -> None:
        done.append(job.payload["n"])

    running = Running(
        leaseq.Worker(app, dsn=database_url, concurrency=2, listen=False, poll_interval=0.1)
    )
    for n in range(3):
        await aqueue.enqueue("reports", {"n": n})
        await _until(lambda n=n: asyncio.sleep(0, len(done) > n))
    await running.stop()
    assert done == [0, 1, 2]


def test_a_hint_during_a_claim_that_comes_back_short_keeps_its_queue() -> None:
    """A job committed after a claim's snapshot is announced while that claim is
    in flight: the claim's short answer must not erase the announcement."""
    hints = WorkHints(["a", "b"], poll_interval=NO_POLL)
    ((name, generation), _) = hints.to_ask(["a", "b"])
    assert name == "a"
    hints.may_have_work("a")  # the notification, while the claim is in flight
    hints.came_back_short("a", generation)
    assert [q for q, _ in hints.to_ask(["a", "b"])] == ["a", "b"]
    # Without a hint in between, a short claim clears its queue until a hint.
    ((_, generation), _) = hints.to_ask(["a", "b"])
    hints.came_back_short("a", generation)
    assert [q for q, _ in hints.to_ask(["a", "b"])] == ["b"]
    hints.may_have_work(None)  # the listener reconnected
    assert [q for q, _ in hints.to_ask(["a", "b"])] == ["a", "b"]


def test_the_poll_makes_every_queue_worth_a_claim_again() -> None:
    hints = WorkHints(["a"], poll_interval=0.0)
    ((_, generation),) = hints.to_ask(["a"])
    hints.came_back_short("a", generation)
    assert [q for q, _ in hints.to_ask(["a"])] == ["a"]  # the poll came due


def test_the_poll_comes_within_its_interval_whatever_the_jitter() -> None:
    """`poll_interval` bounds how long a job no notification announces waits for
    an idle worker (`--no-listen`, `notify=False`): the jitter (which keeps the
    workers of a deploy from polling in step) drew from 0.5-1.5 times it, so a
    job could wait half as long again as the interval said."""
    for _ in range(2_000):
        hints = WorkHints(["a"], poll_interval=10.0)
        ((_, generation),) = hints.to_ask(["a"])
        hints.came_back_short("a", generation)
        assert 0.0 < hints.until_poll() <= 10.0


def test_a_rate_limited_queue_is_asked_again_when_its_window_has_room() -> None:
    hints = WorkHints(["a", "b"], poll_interval=NO_POLL)
    ((_, generation), _) = hints.to_ask(["a", "b"])
    hints.came_back_short("a", generation)
    hints.ask_again_in("a", 0.2)
    assert [q for q, _ in hints.to_ask(["a", "b"])] == ["b"]
    assert 0.1 < hints.until_poll() <= 0.2  # the worker sleeps until then, not the poll
    time.sleep(0.2)
    assert [q for q, _ in hints.to_ask(["a", "b"])] == ["a", "b"]
    assert hints.until_poll() > 60  # asked once: back to the poll


@pytest.mark.asyncio
async def test_limited_queues_go_on_without_waiting_for_the_poll(
    aqueue: leaseq.AsyncQueue, database_url: str, schema: str
) -> None:
    """A claim held back by a concurrency limit is asked again when a limited
    job's end is announced (job_slot_freed); one held back by a rate window,
    when the window has room. With no poll to fall back on, both drain."""
    app = leaseq.App(schema=schema)
    started: dict[str, list[float]] = {"one_at_a_time": [], "rated": []}

    @app.task("one_at_a_time")
    async def one(job: leaseq.JobContext) -> None:
        started["one_at_a_time"].append(time.monotonic())
        await asyncio.sleep(0.02)

    @app.task("rated")
    async def rated(job: leaseq.JobContext) -> None:
        # The claim's own stamp (the database's clock, the rate window's): under
        # load a handler may begin long after its claim (a CI run saw five
        # handlers of two windows begin within 81 ms of each other).
        assert job.claim.claimed_at is not None
        started["rated"].append(job.claim.claimed_at.timestamp())

    await aqueue.configure_queue("one_at_a_time", max_running=1)
    await aqueue.configure_queue("rated", rate_limit=(4, 0.5))
    await aqueue.enqueue_many("one_at_a_time", [{}] * 6)
    await aqueue.enqueue_many("rated", [{}] * 12)
    running = Running(
        leaseq.Worker(
            app, dsn=database_url, concurrency=10, poll_interval=NO_POLL, maintenance=False
        )
    )
    await _until(lambda: _all_finished(aqueue, "one_at_a_time"))
    await _until(lambda: _all_finished(aqueue, "rated"))
    await running.stop()
    assert len(started["one_at_a_time"]) == 6
    assert len(started["rated"]) == 12
    # Three windows of four: the second and third began when the window had room.
    rated_starts = sorted(started["rated"])
    assert rated_starts[4] - rated_starts[0] >= 0.5
    assert rated_starts[8] - rated_starts[4] >= 0.5
