"""Per-key ordering under real worker processes and faults, judged from the job
table and from the handlers' own record of their runs (tests/worker_app.py's
"keyed" task writes each run's start before it works and its end before its
outcome is reported).

Three workers claim 24 keys while producers keep enqueueing (in transactions
that sometimes roll back, single jobs and batches, some delayed, at random
priorities), handlers crash their worker (kill -9) or fail, the test kills
workers -9 and terminates their database connections, and an operator replays
or skips every failed head (the queue blocks keys behind failed heads). What
must never happen:

* two runs of one key at once: checked at every sample on the job table and on
  the handlers' record, and over every pair of runs at the end;
* a run of a job while an earlier job of its key (by seq, then id) that was
  committed before the run began had not finished (done, or skipped);
* a job lost, run to its effect twice, or a key left stuck.
"""

from __future__ import annotations

import itertools
import random
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from datetime import datetime
from typing import Any

import psycopg
import pytest

import leaseq

from .worker_app import KEY_RUN_TABLES
from .worker_processes import Spawn, output_of, worker_processes

Connect = Callable[..., psycopg.Connection[tuple[object, ...]]]

KEYS = [f"key-{n}" for n in range(24)]
LEASE = 4.0


@pytest.fixture
def app_name(schema: str) -> str:
    return f"lq-order-{schema}"[:60]


@pytest.fixture
def spawn_worker(database_url: str, queue: leaseq.Queue, app_name: str) -> Iterator[Spawn]:
    separator = "&" if "?" in database_url else "?"
    url = f"{database_url}{separator}application_name={app_name}"
    with worker_processes(url, queue.schema, own_session=False) as spawn:
        yield spawn


def _started(spawn: Spawn) -> subprocess.Popen[str]:
    process = spawn("--queues", "keyed", "--concurrency", "4")
    deadline = time.monotonic() + 30
    while "worker started" not in output_of(process):
        assert process.poll() is None, output_of(process)
        assert time.monotonic() < deadline, output_of(process)
        time.sleep(0.05)
    return process


def _now(conn: psycopg.Connection[Any]) -> datetime:
    row = conn.execute("SELECT clock_timestamp()").fetchone()
    assert row is not None
    return row[0]  # type: ignore[no-any-return]


def _payload(rng: random.Random) -> dict[str, Any]:
    payload: dict[str, Any] = {"sleep": rng.choice([0, 0.01, 0.03, 0.08])}
    roll = rng.random()
    if roll < 0.03:
        payload["crash"] = True
    elif roll < 0.10:
        payload["flaky"] = True
    elif roll < 0.15:
        payload["fail_once"] = True
    return payload


@pytest.mark.slow
def test_keys_run_one_at_a_time_and_in_order_under_kills_and_terminations(
    queue: leaseq.Queue, connect: Connect, spawn_worker: Spawn, app_name: str
) -> None:
    schema = queue.schema
    with connect(autocommit=True) as conn:
        for statement in KEY_RUN_TABLES:
            conn.execute(statement.format(schema=f'"{schema}"'))
    queue.configure_queue("keyed", ordering_policy="block", lease=LEASE)
    rng = random.Random(7)
    lock = threading.Lock()
    # job id -> clock_timestamp() read after its enqueue committed
    committed: dict[int, datetime] = {}
    killed: dict[int, datetime] = {}  # worker pid -> a time after it died
    violations: list[str] = []
    errors: list[BaseException] = []
    producing = threading.Event()
    stop = threading.Event()

    # The keys' first jobs, in one batch per key, their seqs out of order.
    with connect(autocommit=True) as conn:
        for key in KEYS:
            seqs = rng.sample(range(1, 50), 5)
            with conn.transaction():
                ids = queue.enqueue_many(
                    "keyed", [_payload(rng) for _ in seqs], key=key, seqs=seqs, conn=conn
                )
            at = _now(conn)
            committed.update(dict.fromkeys(ids, at))

    def guarded(body: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            try:
                body()
            except BaseException as exc:
                errors.append(exc)
                stop.set()

        return run

    def produce(seed: int) -> None:
        local = random.Random(seed)
        with connect(autocommit=True) as conn:
            while producing.is_set():
                key = local.choice(KEYS)
                rollback = local.random() < 0.15
                ids: list[int] = []
                with conn.transaction(force_rollback=rollback):
                    if local.random() < 0.4:
                        seqs = [local.randint(50, 150) for _ in range(local.randint(2, 4))]
                        ids += queue.enqueue_many(
                            "keyed",
                            [_payload(local) for _ in seqs],
                            key=key,
                            seqs=seqs,
                            priority=local.randint(-2, 2),
                            delay=local.choice([None, 0.3]),
                            conn=conn,
                        )
                    else:
                        ids.append(
                            queue.enqueue(
                                "keyed",
                                _payload(local),
                                key=key,
                                seq=local.randint(50, 150),
                                priority=local.randint(-2, 2),
                                delay=local.choice([None, None, 0.3]),
                                conn=conn,
                            )
                        )
                    time.sleep(local.uniform(0, 0.03))
                if not rollback:
                    at = _now(conn)
                    with lock:
                        committed.update(dict.fromkeys(ids, at))
                time.sleep(local.uniform(0.05, 0.2))

    def operate() -> None:
        """Replays or skips every failed head, as an operator would."""
        turn = 0
        while not stop.is_set():
            for job in queue.list_jobs("failed", queue="keyed"):
                turn += 1
                if turn % 2:
                    queue.replay(job.job_id)
                else:
                    queue.cancel(job.job_id, only_failed=True, lease_version=job.lease_version)
            time.sleep(0.2)

    def sample() -> None:
        with connect(autocommit=True) as conn:
            while not stop.is_set():
                doubled = conn.execute(
                    f'SELECT ordering_key, array_agg(job_id) FROM "{schema}".job'
                    " WHERE status = 'running' GROUP BY ordering_key HAVING count(*) > 1"
                ).fetchall()
                with lock:
                    dead = list(killed)
                overlapping = conn.execute(
                    f'SELECT ordering_key, array_agg(job_id) FROM "{schema}".key_run'
                    " WHERE ended_at IS NULL AND pid <> ALL(%s)"
                    " GROUP BY ordering_key HAVING count(*) > 1",
                    (dead,),
                ).fetchall()
                for key, ids in doubled:
                    violations.append(f"job table: {ids} of {key} running at once")
                for key, ids in overlapping:
                    rows = conn.execute(
                        f'SELECT * FROM "{schema}".key_run WHERE ordering_key = %s'
                        " ORDER BY started_at DESC LIMIT 4",
                        (key,),
                    ).fetchall()
                    violations.append(f"handlers: {ids} of {key} running at once: {rows}")
                time.sleep(0.03)

    def terminate() -> None:
        """pg_terminate_backend of one of the workers' connections now and then."""
        local = random.Random(11)
        with connect(autocommit=True) as conn:
            while not stop.is_set():
                time.sleep(local.uniform(0.5, 1.5))
                pids = [
                    pid
                    for (pid,) in conn.execute(
                        "SELECT pid FROM pg_stat_activity WHERE application_name = %s",
                        (app_name,),
                    )
                ]
                if pids:
                    conn.execute("SELECT pg_terminate_backend(%s)", (local.choice(pids),))

    workers = [_started(spawn_worker) for _ in range(3)]
    spawned = list(workers)

    def watch() -> None:
        """Notes when each worker died (a handler crashed it, or the test killed
        it), at once: its runs end then, and the sampler leaves them out."""
        with connect(autocommit=True) as conn:
            while not stop.is_set():
                with lock:
                    alive = [w for w in spawned if w.pid not in killed]
                for worker in alive:
                    if worker.poll() is not None:
                        at = _now(conn)
                        with lock:
                            killed[worker.pid] = at
                time.sleep(0.02)

    producing.set()
    threads = [threading.Thread(target=guarded(lambda s=s: produce(s))) for s in (1, 2, 3)]
    threads += [threading.Thread(target=guarded(f)) for f in (operate, sample, terminate, watch)]
    for thread in threads:
        thread.start()

    def reap_dead_workers() -> None:
        for n, worker in enumerate(workers):
            if worker.poll() is not None:
                workers[n] = _started(spawn_worker)
                with lock:
                    spawned.append(workers[n])

    killer = random.Random(5)
    produce_until = time.monotonic() + 12
    next_kill = time.monotonic() + 2
    try:
        while time.monotonic() < produce_until and not stop.is_set():
            if time.monotonic() > next_kill:
                killer.choice(workers).send_signal(signal.SIGKILL)
                next_kill = time.monotonic() + killer.uniform(2, 4)
            time.sleep(0.05)
            reap_dead_workers()
        producing.clear()
        # Drain: every committed job done or skipped, none queued, running or failed.
        deadline = time.monotonic() + 40
        while time.monotonic() < deadline and not stop.is_set():
            reap_dead_workers()
            (stats,) = [s for s in queue.stats() if s.queue == "keyed"]
            if stats.queued == stats.running == stats.failed == 0:
                break
            time.sleep(0.2)
    finally:
        stop.set()
        producing.clear()
        for thread in threads:
            thread.join(30)
    for worker in workers:
        worker.send_signal(signal.SIGTERM)
    for worker in workers:
        worker.wait(30)
    assert not errors, errors
    assert violations == [], "\n".join(violations[:10])

    with connect(autocommit=True) as conn:
        jobs = {
            int(job_id): (key, int(seq), status, finished_at)
            for job_id, key, seq, status, finished_at in conn.execute(
                "SELECT job_id, ordering_key, ordering_seq, status, finished_at"
                f" FROM \"{schema}\".job WHERE queue = 'keyed'"
            )
        }
        runs = conn.execute(
            f"SELECT job_id, ordering_key, pid, started_at, ended_at, claimed_at"
            f' FROM "{schema}".key_run ORDER BY started_at'
        ).fetchall()
        effects = dict(
            conn.execute(f'SELECT job_id, count(*) FROM "{schema}".key_effect GROUP BY job_id')
        )
    unfinished = {j: s for j, (_, _, s, _) in jobs.items() if s not in ("done", "cancelled")}
    assert unfinished == {}, f"stuck or lost: {unfinished}"
    assert set(jobs) == set(committed), "a job was lost, or a rolled-back one exists"
    done = {j for j, (_, _, s, _) in jobs.items() if s == "done"}
    assert {j: n for j, n in effects.items() if n != 1} == {}, "an effect happened twice"
    assert set(effects) == done

    # Every run of a key ends before the next one starts (a run cut by kill -9
    # ends when its worker died).
    by_key: dict[str, list[tuple[datetime, datetime, int]]] = {}
    for job_id, key, pid, started_at, ended_at, _ in runs:
        end = ended_at if ended_at is not None else killed.get(pid)
        assert end is not None, f"a run of {job_id} never ended and its worker lives"
        by_key.setdefault(key, []).append((started_at, end, job_id))
    for key, key_runs in by_key.items():
        for (_, end, before), (start, _, after) in itertools.pairwise(key_runs):
            assert start >= end, f"{key}: {after} started before {before} ended"
    # No run of a job while an earlier job of its key, committed before the
    # run's claim, was unfinished.
    for job_id, key, _pid, started_at, _ended, claimed_at in runs:
        _, seq, _, _ = jobs[job_id]
        for other, (other_key, other_seq, status, finished_at) in jobs.items():
            if other_key != key or (other_seq, other) >= (seq, job_id):
                continue
            if claimed_at is None or committed[other] >= claimed_at:
                continue  # a slow producer's job: it may come after
            if finished_at is None or finished_at > started_at:
                with connect(autocommit=True) as conn:
                    detail = conn.execute(
                        f'SELECT job_id, ordering_seq, status, history FROM "{schema}".job'
                        " WHERE job_id IN (%s, %s)",
                        (job_id, other),
                    ).fetchall()
                    key_runs = conn.execute(
                        f'SELECT * FROM "{schema}".key_run WHERE ordering_key = %s'
                        " ORDER BY started_at",
                        (key,),
                    ).fetchall()
                pytest.fail(
                    f"{key}: {job_id} (seq {seq}) claimed at {claimed_at} before {other} "
                    f"(seq {other_seq}, {status}, committed by {committed[other]}, finished"
                    f" {finished_at}) had finished\n{detail}\n" + "\n".join(map(str, key_runs))
                )
