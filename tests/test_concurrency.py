"""Concurrent workers on one real database: SKIP LOCKED claims, limits, ordering, recovery.

Every test is bounded: threads are joined with a timeout and processes stop when
the queue is empty. No assertion depends on how fast anything runs.
"""

from __future__ import annotations

import multiprocessing
import queue as queue_module
import random
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any, TypeVar

import psycopg
import pytest

import leaseq
from leaseq import Claim, JobStatus

from .conftest import Clock

T = TypeVar("T")
Connect = Callable[..., psycopg.Connection[tuple[object, ...]]]

JOIN_TIMEOUT = 60.0  # seconds a group of workers may take before the test fails
PROMPT = 10.0  # seconds a claim next to a locked row may take before it counts as blocked


def _run_threads(count: int, target: Callable[[int], None], timeout: float = JOIN_TIMEOUT) -> None:
    """Run ``target(i)`` in ``count`` threads; fail if any raises or is still running."""
    errors: list[BaseException] = []
    start = threading.Barrier(count)

    def body(index: int) -> None:
        try:
            start.wait(timeout)
            target(index)
        except BaseException as exc:
            errors.append(exc)

    threads = [
        threading.Thread(target=body, args=(i,), name=f"worker-{i}", daemon=True)
        for i in range(count)
    ]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + timeout
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    stuck = [thread.name for thread in threads if thread.is_alive()]
    assert not stuck, f"workers still running after {timeout}s: {stuck}"
    if errors:
        raise errors[0]


class _Background:
    """One call in a thread, so that a call that blocks cannot hang the test."""

    def __init__(self, call: Callable[[], Any]) -> None:
        self.result: Any = None
        self.error: BaseException | None = None
        self._call = call
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self.result = self._call()
        except BaseException as exc:
            self.error = exc

    def finished_within(self, seconds: float) -> bool:
        self._thread.join(seconds)
        return not self._thread.is_alive()

    def value(self) -> Any:
        if self.error is not None:
            raise self.error
        return self.result


def _lock_job(connect: Connect, schema: str, job_id: int) -> psycopg.Connection[Any]:
    """Hold a row lock on ``job_id`` in an open transaction of a new connection."""
    holder = connect()
    rows = holder.execute(
        f'SELECT job_id FROM "{schema}".job WHERE job_id = %s FOR UPDATE', (job_id,)
    ).fetchall()
    assert rows == [(job_id,)]
    # The lock is really held: anyone else asking for it without skipping is refused.
    with connect() as other, pytest.raises(psycopg.errors.LockNotAvailable):
        other.execute(
            f'SELECT job_id FROM "{schema}".job WHERE job_id = %s FOR UPDATE NOWAIT', (job_id,)
        )
    return holder


def _statuses(queue: leaseq.Queue) -> dict[JobStatus, int]:
    (stats,) = queue.stats("work")
    return {status: n for status, n in stats.counts.items() if n}


# -- 1 and 3: concurrent claimers share the work, never a job ----------------------------------


def _drain(queue: leaseq.Queue, seed: int, log: list[tuple[int, int, list[int]]]) -> None:
    """Claim (random limit) and complete until a claim comes back empty.

    Appends (limit, rows returned, job ids) per claim. A claim that lost its job to
    a duplicate claim raises LeaseLost on complete, which fails the test.
    """
    rng = random.Random(seed)
    while True:
        limit = rng.randint(1, 5)
        claims = queue.claim("work", limit=limit)
        log.append((limit, len(claims), [c.job_id for c in claims]))
        if not claims:
            return
        for claim in claims:
            queue.complete(claim)


def _check_drained(
    queue: leaseq.Queue, ids: list[int], logs: list[list[tuple[int, int, list[int]]]]
) -> None:
    over_limit = [(limit, got) for log in logs for limit, got, _ in log if got > limit]
    assert over_limit == [], "a claim returned more rows than its limit"
    claimed = [job_id for log in logs for _, _, batch in log for job_id in batch]
    duplicates = {job_id: n for job_id, n in Counter(claimed).items() if n > 1}
    assert duplicates == {}, "jobs claimed more than once"
    assert sorted(claimed) == sorted(ids), "jobs never claimed"
    assert _statuses(queue) == {JobStatus.DONE: len(ids)}
    # The work really was shared, and limits above 1 were used and filled.
    assert sum(1 for log in logs if any(batch for _, _, batch in log)) >= 2
    assert any(got > 1 for log in logs for _, got, _ in log)


@pytest.mark.slow
@pytest.mark.parametrize("sharing", ["queue_per_thread", "shared_queue"])
def test_concurrent_claimers_get_different_jobs(
    queue: leaseq.Queue, database_url: str, schema: str, sharing: str
) -> None:
    ids = queue.enqueue_many("work", [{"n": n} for n in range(3000)])
    workers = 8
    logs: list[list[tuple[int, int, list[int]]]] = [[] for _ in range(workers)]
    queues: list[leaseq.Queue] = []
    if sharing == "shared_queue":
        shared = leaseq.Queue(database_url, schema=schema, pool_size=workers)
        queues = [shared] * workers
    else:
        queues = [leaseq.Queue(database_url, schema=schema, pool_size=1) for _ in range(workers)]
    try:
        _run_threads(workers, lambda i: _drain(queues[i], seed=i, log=logs[i]))
    finally:
        for q in set(queues):
            q.close()
    _check_drained(queue, ids, logs)


def _drain_in_process(
    database_url: str,
    schema: str,
    seed: int,
    start: Any,
    results: Any,
) -> None:
    """A worker process: its own Queue, drains, reports its claims (or its error)."""
    log: list[tuple[int, int, list[int]]] = []
    try:
        with leaseq.Queue(database_url, schema=schema, pool_size=1) as queue:
            queue.stats("work")  # connect before the start line
            start.wait(JOIN_TIMEOUT)
            _drain(queue, seed, log)
        results.put((seed, log, None))
    except BaseException as exc:
        results.put((seed, log, repr(exc)))


@pytest.mark.slow
def test_concurrent_processes_get_different_jobs(
    queue: leaseq.Queue, database_url: str, schema: str
) -> None:
    ids = queue.enqueue_many("work", [{"n": n} for n in range(2000)])
    context = multiprocessing.get_context("spawn")
    workers = 4
    start = context.Barrier(workers)
    results = context.Queue()
    processes = [
        context.Process(
            target=_drain_in_process,
            args=(database_url, schema, seed, start, results),
            name=f"leaseq-drain-{seed}",
        )
        for seed in range(workers)
    ]
    for process in processes:
        process.start()
    reports = []
    try:
        deadline = time.monotonic() + JOIN_TIMEOUT
        for _ in processes:
            try:
                reports.append(results.get(timeout=max(0.1, deadline - time.monotonic())))
            except queue_module.Empty:
                break
        for process in processes:
            process.join(max(0.1, deadline - time.monotonic()))
        stuck = [p.name for p in processes if p.is_alive()]
    finally:
        for process in processes:
            if process.is_alive():  # only after a failure: never leave one behind
                process.kill()
                process.join(5)
        results.close()
        results.join_thread()
    assert stuck == []
    assert len(reports) == workers
    assert [(seed, error) for seed, _, error in reports if error] == []
    assert [p.exitcode for p in processes] == [0] * workers
    _check_drained(queue, ids, [log for _, log, _ in reports])


# -- 2: a locked row never makes a claim wait -------------------------------------------------


def test_locked_row_does_not_block_claim_of_another(
    queue: leaseq.Queue, connect: Connect, schema: str
) -> None:
    first, second = queue.enqueue_many("work", [{"n": 1}, {"n": 2}])
    holder = _lock_job(connect, schema, first)
    claim = _Background(lambda: queue.claim("work", limit=1))
    try:
        assert claim.finished_within(PROMPT), "claim waited for a row another transaction locked"
        assert [c.job_id for c in claim.value()] == [second]
    finally:
        holder.rollback()
        assert claim.finished_within(PROMPT)
    # Once the lock is gone the skipped row is claimable: it was skipped, not lost.
    assert [c.job_id for c in queue.claim("work", limit=5)] == [first]


def test_claim_returns_nothing_when_the_only_eligible_row_is_locked(
    queue: leaseq.Queue, connect: Connect, schema: str
) -> None:
    (only,) = queue.enqueue_many("work", [{"n": 1}])
    holder = _lock_job(connect, schema, only)
    claim = _Background(lambda: queue.claim("work", limit=3))
    try:
        assert claim.finished_within(PROMPT), "claim waited for a row another transaction locked"
        assert claim.value() == []
        assert queue.get(only).status is JobStatus.QUEUED
    finally:
        holder.rollback()
        assert claim.finished_within(PROMPT)
    (claimed,) = queue.claim("work", limit=3)
    assert (claimed.job_id, claimed.lease_version, claimed.attempts) == (only, 1, 1)


def test_locked_expired_lease_does_not_block_recovery_of_another(
    queue: leaseq.Queue, connect: Connect, schema: str, clock: Clock
) -> None:
    first, second = queue.enqueue_many("work", [{"n": 1}, {"n": 2}])
    assert len(queue.claim("work", limit=2, lease=5)) == 2
    clock.advance(10)
    holder = _lock_job(connect, schema, first)
    claim = _Background(lambda: queue.claim("work", limit=1))
    try:
        assert claim.finished_within(PROMPT), "claim waited for a row another transaction locked"
        (recovered,) = claim.value()
        assert (recovered.job_id, recovered.lease_version) == (second, 2)
    finally:
        holder.rollback()
        assert claim.finished_within(PROMPT)
    assert [(c.job_id, c.lease_version) for c in queue.claim("work", limit=5)] == [(first, 2)]


# -- 4: an ordering key's next job is never claimed before the previous one finished -------


@pytest.mark.slow
def test_ordering_key_heads_are_claimed_only_after_completion(queue: leaseq.Queue) -> None:
    queue.configure_queue("work", ordering_policy="block")
    per_key = 30
    rng = random.Random(7)
    seqs: dict[str, list[int]] = {}
    for key in ("a", "b"):
        # Sequence numbers out of insertion order: only seq may decide.
        seqs[key] = rng.sample(range(1, 10 * per_key), per_key)
        queue.enqueue_many(
            "work", [{"key": key, "seq": s} for s in seqs[key]], key=key, seqs=seqs[key]
        )
    unkeyed = queue.enqueue_many("work", [{"n": n} for n in range(60)])
    total = 2 * per_key + len(unkeyed)

    # Completions are committed and logged under `log_lock`; a claim is logged under it
    # after its commit. A claim that depends on a completion therefore always appears
    # after that completion in `events`, and a premature claim appears before it.
    log_lock = threading.Lock()
    events: list[tuple[str, str, int | None]] = []
    batches: list[list[Claim]] = []
    finished = [0]

    def worker(index: int) -> None:
        local = random.Random(index)
        deadline = time.monotonic() + JOIN_TIMEOUT
        while time.monotonic() < deadline:
            with log_lock:
                if finished[0] == total:
                    return
            claims = queue.claim("work", limit=local.randint(1, 4))
            with log_lock:
                batches.append(claims)
                events.extend(("claim", c.key, c.seq) for c in claims if c.key is not None)
            if not claims:
                time.sleep(0.002)
            for claim in claims:
                with log_lock:
                    queue.complete(claim)
                    if claim.key is not None:
                        events.append(("done", claim.key, claim.seq))
                    finished[0] += 1

    _run_threads(6, worker)
    assert finished[0] == total
    for batch in batches:
        keys = [c.key for c in batch if c.key is not None]
        assert len(keys) == len(set(keys)), "one claim returned two jobs of one key"
    for key in ("a", "b"):
        history = [(kind, seq) for kind, k, seq in events if k == key]
        expected = [(kind, seq) for seq in sorted(seqs[key]) for kind in ("claim", "done")]
        assert history == expected, f"key {key!r}: claims and completions interleaved wrongly"
        # The database agrees on the jobs and their single attempts. (Its timestamps
        # cannot order a claim after a completion: statement_timestamp() is when a
        # statement arrived, not when it took its snapshot, so a claim that arrived
        # a moment before a completion committed may rightly see it committed.)
        jobs = sorted(
            (j for j in queue.list_jobs("done", queue="work", limit=1000) if j.key == key),
            key=lambda j: j.seq or 0,
        )
        assert [j.seq for j in jobs] == sorted(seqs[key])
        assert all(j.attempts == 1 for j in jobs)
        assert all(j.lease_version == 1 for j in jobs)
    assert _statuses(queue) == {JobStatus.DONE: total}


# -- 5: expired leases are recovered once each, and the stale owners are fenced off ----------


@pytest.mark.slow
def test_expired_leases_are_reclaimed_exactly_once(queue: leaseq.Queue, clock: Clock) -> None:
    count = 200
    ids = queue.enqueue_many("work", [{"n": n} for n in range(count)])
    stale = queue.claim("work", limit=count, lease=5)
    assert sorted(c.job_id for c in stale) == ids
    assert {(c.lease_version, c.attempts) for c in stale} == {(1, 1)}
    clock.advance(10)

    workers = 6
    reclaimed: list[list[Claim]] = [[] for _ in range(workers)]

    def reclaim(index: int) -> None:
        rng = random.Random(index)
        while claims := queue.claim("work", limit=rng.randint(1, 4)):
            reclaimed[index].extend(claims)

    _run_threads(workers, reclaim)
    fresh = [c for claims in reclaimed for c in claims]
    assert Counter(c.job_id for c in fresh).most_common(1)[0][1] == 1, "a job reclaimed twice"
    assert sorted(c.job_id for c in fresh) == ids
    assert {(c.lease_version, c.attempts) for c in fresh} == {(2, 2)}
    assert sum(1 for claims in reclaimed if claims) >= 2

    lost: list[leaseq.LeaseLost] = []

    def complete_stale(index: int) -> None:
        for claim in stale[index::workers]:
            with pytest.raises(leaseq.LeaseLost) as info:
                queue.complete(claim)
            lost.append(info.value)

    _run_threads(workers, complete_stale)
    assert sorted((e.job_id, e.lease_version) for e in lost) == [(i, 1) for i in ids]
    assert _statuses(queue) == {JobStatus.RUNNING: count}

    assert all(ok for _, ok in queue.complete_many(fresh))
    assert _statuses(queue) == {JobStatus.DONE: count}
    assert {queue.get(i).lease_version for i in ids} == {2}


# -- a retried fenced write that races its own first attempt -----------------------------------


def _wait_until_blocked_on_a_lock(connect: Connect, blocker: psycopg.Connection[Any]) -> None:
    """Wait (bounded) until a leaseq statement waits for a lock ``blocker`` holds.

    (pg_blocking_pids, not the query text: pg_stat_activity cuts long statements.)
    """
    with connect(autocommit=True) as watcher:
        deadline = time.monotonic() + PROMPT
        while time.monotonic() < deadline:
            waiting = watcher.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'leaseq'"
                " AND %s = ANY(pg_blocking_pids(pid))",
                (blocker.info.backend_pid,),
            ).fetchone()
            if waiting and waiting[0]:
                return
            time.sleep(0.01)
    pytest.fail("the second write never waited for the first one's row lock")


@pytest.mark.parametrize("write", ["complete", "retry"])
def test_duplicate_write_waiting_for_its_first_attempt_is_accepted(
    queue: leaseq.Queue, connect: Connect, schema: str, write: str
) -> None:
    job_id = queue.enqueue("work", {})
    (claim,) = queue.claim("work")

    def send(conn: psycopg.Connection[Any] | None = None) -> None:
        if write == "complete":
            queue.complete(claim, conn=conn)
        else:
            queue.retry(claim, delay=60, conn=conn)

    # The first attempt has written but not yet committed (its commit is in flight)
    # when the caller, unsure whether it went through, sends the same write again.
    first = connect()
    send(first)
    again = _Background(send)
    try:
        _wait_until_blocked_on_a_lock(connect, first)
        first.commit()
        assert again.finished_within(PROMPT)
    finally:
        first.rollback()
        assert again.finished_within(PROMPT)
    job = queue.get(job_id)
    assert job.lease_version == claim.lease_version
    assert job.status is (JobStatus.DONE if write == "complete" else JobStatus.QUEUED)
    again.value()  # the retry of a write that committed is accepted, as when it comes later
