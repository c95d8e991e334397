"""Per-key ordering where an operator's or a producer's change races a settler.

The oracle is the contract (DESIGN 1.10): only the earliest unfinished job of a
key is eligible, a failed head follows the queue's policy *as it is now*, and a
key whose head may run is never stuck (some claim takes it, within a bounded
wait for the repair notes that settle a key again).
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable

import psycopg
import pytest

import leaseq

from .conftest import Clock

Connect = Callable[..., psycopg.Connection[tuple[object, ...]]]


def _claim_within(queue: leaseq.Queue, seconds: float) -> list[int]:
    """What claims return within ``seconds``: repair notes are acted on by the
    claims themselves, each settling a key again 200 ms after it could not."""
    deadline = time.monotonic() + seconds
    while True:
        ids = [c.job_id for c in queue.claim("events", limit=10, lease=60)]
        if ids or time.monotonic() > deadline:
            return ids
        time.sleep(0.05)


def _blocked_by(connect: Connect, pid: int, seconds: float = 10) -> bool:
    """Whether some session waits on the one of ``pid`` within ``seconds``."""
    with connect(autocommit=True) as watcher:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            row = watcher.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE %s = ANY(pg_blocking_pids(pid))",
                (pid,),
            ).fetchone()
            if row and row[0]:
                return True
            time.sleep(0.01)
    return False


def test_a_head_failed_while_the_policy_turns_to_continue_does_not_leave_its_key_stuck(
    queue: leaseq.Queue, connect: Connect
) -> None:
    """A handler fails its job in its own transaction (READ COMMITTED) while an
    operator switches the queue from 'block' to 'continue'. The fail settles
    the key under 'block' (the change is not committed yet): the next job
    waits. The change settles the keys with a failed job it sees, and the fail
    is not committed yet. Both commit: the queue says 'continue', the key's
    head failed, and its next job must go on."""
    queue.configure_queue("events", ordering_policy="block")
    queue.enqueue("events", {}, key="k", seq=1)
    second = queue.enqueue("events", {}, key="k", seq=2)
    (claim,) = queue.claim("events")
    handler = connect()
    queue.fail(claim, "broken", conn=handler)  # settled under 'block'
    errors: list[BaseException] = []

    def change() -> None:
        try:
            queue.configure_queue("events", ordering_policy="continue")
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    operator = threading.Thread(target=change)
    operator.start()
    # The change either committed already or waits for the handler's transaction.
    operator.join(2)
    if operator.is_alive():
        assert _blocked_by(connect, handler.info.backend_pid)
    handler.commit()
    operator.join(30)
    assert not operator.is_alive()
    assert not errors, errors
    assert (settings := queue.queue_settings("events")) is not None
    assert settings.ordering_policy == "continue"
    assert _claim_within(queue, 5) == [second], "the key is stuck behind its failed head"


@pytest.mark.parametrize("flips", [False, True], ids=["block", "policy-flips"])
def test_producers_claimers_and_an_operator_never_run_a_key_twice_nor_leave_it_stuck(
    queue: leaseq.Queue, connect: Connect, clock: Clock, flips: bool
) -> None:
    """Producers enqueue into 6 keys (single jobs and batches, some delayed, in
    transactions that sometimes roll back) while claimers complete, retry, fail
    and release, and an operator replays and skips failed jobs, cancels running
    ones (their keys then held until the cut lease would have ended) and, in
    one leg, flips the policy between 'block' and 'continue'. No claim may
    return a job of a key whose claim is still held; once it all stops, with
    leases and holds run out and failed jobs skipped, every job must be claimed:
    none is left stuck."""
    queue.configure_queue("events", ordering_policy="block")
    keys = [f"k{n}" for n in range(6)]
    lock = threading.Lock()
    held: dict[str, int] = {}
    violations: list[str] = []
    errors: list[BaseException] = []
    producing = threading.Event()
    producing.set()
    claiming = threading.Event()
    claiming.set()

    def guarded(body: Callable[[int], None], seed: int) -> threading.Thread:
        def run() -> None:
            try:
                body(seed)
            except BaseException as exc:
                errors.append(exc)

        return threading.Thread(target=run)

    def produce(seed: int) -> None:
        rng = random.Random(seed)
        with connect(autocommit=True) as conn:
            for _ in range(60):
                key = rng.choice(keys)
                with conn.transaction(force_rollback=rng.random() < 0.15):
                    for _ in range(rng.randint(1, 2)):
                        delay = rng.choice([None, None, 0.2])
                        if rng.random() < 0.4:
                            seqs = [rng.randint(0, 20) for _ in range(rng.randint(2, 3))]
                            queue.enqueue_many(
                                "events",
                                [{}] * len(seqs),
                                key=key,
                                seqs=seqs,
                                delay=delay,
                                conn=conn,
                            )
                        else:
                            seq = rng.choice([None, rng.randint(0, 20)])
                            queue.enqueue("events", {}, key=key, seq=seq, delay=delay, conn=conn)
                    time.sleep(rng.uniform(0, 0.01))
        producing.clear()

    def consume(seed: int) -> None:
        rng = random.Random(seed)
        while claiming.is_set():
            claims = queue.claim("events", limit=rng.randint(1, 3), lease=30)
            with lock:
                for claim in claims:
                    assert claim.key is not None
                    if claim.key in held:
                        violations.append(f"{claim.job_id} claimed while {held[claim.key]} runs")
                    held[claim.key] = claim.job_id
            if not claims:
                time.sleep(0.01)
                continue
            time.sleep(rng.uniform(0, 0.005))
            for claim in claims:
                roll = rng.random()
                lost = False
                try:
                    if roll < 0.7:
                        queue.complete(claim)
                    elif roll < 0.8:
                        queue.retry(claim, delay=0)
                    elif roll < 0.9:
                        queue.fail(claim, "boom")
                    else:
                        ((_, released),) = queue.release_many([claim])
                        lost = not released
                except leaseq.LeaseLost:
                    lost = True  # cancelled while running: its key stays held meanwhile
                with lock:
                    # A claim cancelled while running (its write refused) holds its
                    # key until its lease would have ended: it stays held here too.
                    # A write that went through ended the run, whatever the operator
                    # did to the job next (the status read afterwards said CANCELLED
                    # for a failed job skipped, or a retried one cancelled, just
                    # after: its key then looked held by a job no longer running).
                    if not lost and held.get(claim.key or "") == claim.job_id:
                        del held[claim.key or ""]

    def operate(seed: int) -> None:
        rng = random.Random(seed)
        while producing.is_set():
            failed = queue.list_jobs("failed", queue="events", limit=20)
            running = queue.list_jobs("running", queue="events", limit=20)
            roll = rng.random()
            if failed and roll < 0.4:
                job = rng.choice(failed)
                queue.replay(job.job_id)
            elif failed and roll < 0.7:
                job = rng.choice(failed)
                queue.cancel(job.job_id, only_failed=True, lease_version=job.lease_version)
            elif running and roll < 0.75:
                queue.cancel(rng.choice(running).job_id, running=True)
            elif flips and roll < 0.9:
                queue.configure_queue("events", ordering_policy=rng.choice(["block", "continue"]))
            time.sleep(rng.uniform(0, 0.02))

    threads = [guarded(produce, n) for n in range(3)]
    threads += [guarded(consume, 10 + n) for n in range(3)]
    threads.append(guarded(operate, 20))
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + 60
    while producing.is_set() and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.5)
    claiming.clear()
    for thread in threads:
        thread.join(30)
    assert not any(t.is_alive() for t in threads), "threads did not finish"
    assert not errors, errors
    assert violations == []

    # Liveness: leases and holds run out, failed jobs are skipped; every job left
    # must then be claimed within a few rounds (repair notes included).
    idle = 0
    for _ in range(2000):
        for job in queue.list_jobs("failed", queue="events", limit=1000):
            queue.cancel(job.job_id, only_failed=True)
        claims = queue.claim("events", limit=100, lease=30)
        for claim in claims:
            queue.complete(claim)  # one job of each key a round: keys run one at a time
        if claims:
            idle = 0
            continue
        (stats,) = queue.stats("events")
        if stats.queued == stats.running == stats.failed == 0:
            break
        idle += 1
        if idle > 5:
            break
        clock.advance(31)  # leases and holds run out
        queue.reap()
        time.sleep(0.25)  # a repair note looks again 200 ms later
    (stats,) = queue.stats("events")
    with queue.connection() as conn:
        left = conn.execute(
            f"SELECT job_id, ordering_key, ordering_seq, status, blocked, available_at"
            f" FROM \"{queue.schema}\".job WHERE status IN ('queued', 'running')"
            " ORDER BY ordering_key, ordering_seq, job_id"
        ).fetchall()
        detail = conn.execute(
            f"SELECT job_id, ordering_key, ordering_seq, status, blocked, attempts, max_attempts,"
            f' available_at, "{queue.schema}".clock(), history'
            f' FROM "{queue.schema}".job WHERE ordering_key = %s'
            " AND status IN ('queued', 'running', 'failed') ORDER BY ordering_seq, job_id LIMIT 4",
            (left[0][1] if left else "",),
        ).fetchall()
        holds = conn.execute(f'SELECT * FROM "{queue.schema}".key_hold').fetchall()
        notes = conn.execute(f'SELECT * FROM "{queue.schema}".key_repair').fetchall()
    assert left == [], "stuck:\n" + "\n".join(map(str, detail)) + f"\n{holds}\n{notes}"


def test_priority_does_not_reorder_a_key(queue: leaseq.Queue) -> None:
    """README: a key goes by seq, then job id; a later job's higher priority does
    not let it pass the key's earlier one (it orders the heads of keys only)."""
    first = queue.enqueue("events", {}, key="k", priority=-5)
    second = queue.enqueue("events", {}, key="k", priority=10)
    plain = queue.enqueue("events", {}, priority=5)
    claims = queue.claim("events", limit=10)
    assert [c.job_id for c in claims] == [plain, first]
    for claim in claims:
        queue.complete(claim)
    assert [c.job_id for c in queue.claim("events", limit=10)] == [second]
