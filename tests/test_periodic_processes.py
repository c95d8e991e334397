"""Periodic jobs under real worker processes: 3 workers, 50 schedules ticking
every second for a minute, workers killed (-9) and stopped (SIGTERM) and
restarted in between: every tick enqueued exactly once, none lost, each tick's
effect written once."""

from __future__ import annotations

import itertools
import signal
import subprocess
import time
from collections import Counter
from collections.abc import Iterator
from datetime import datetime, timedelta

import pytest

import leaseq

from .worker_app import TABLES
from .worker_processes import Spawn, output_of, worker_processes

SCHEDULES = 50
RUN_SECONDS = 60


@pytest.fixture
def spawn_worker(
    database_url: str, queue: leaseq.Queue, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Spawn]:
    with queue.connection() as conn:
        for statement in TABLES:
            conn.execute(statement.format(schema=f'"{queue.schema}"'))
    monkeypatch.setenv("LEASEQ_TEST_SCHEDULES", str(SCHEDULES))
    with worker_processes(database_url, queue.schema, own_session=False) as spawn:
        yield spawn


def _keys(queue: leaseq.Queue, sql: str) -> Counter[str]:
    with queue.connection() as conn:
        rows = conn.execute(sql.replace("{schema}", f'"{queue.schema}"')).fetchall()
    return Counter(str(row[0]) for row in rows)


def _started(spawn: Spawn) -> subprocess.Popen[str]:
    """A worker, once it runs (its signal handlers are in place)."""
    process = spawn("--concurrency", "20")
    deadline = time.monotonic() + 30
    while "worker started" not in output_of(process):
        assert process.poll() is None, output_of(process)
        assert time.monotonic() < deadline, output_of(process)
        time.sleep(0.1)
    return process


@pytest.mark.slow
@pytest.mark.server_agnostic  # the scheduler's processes and signals; test_periodic has its SQL
def test_each_tick_once_across_workers_and_restarts(
    queue: leaseq.Queue, spawn_worker: Spawn, monkeypatch: pytest.MonkeyPatch
) -> None:
    workers: list[subprocess.Popen[str]] = [_started(spawn_worker) for _ in range(3)]
    started = time.monotonic()
    turn = 0
    while time.monotonic() - started < RUN_SECONDS:
        time.sleep(6)
        victim = workers.pop(turn % len(workers))
        if turn % 2 == 0:
            victim.send_signal(signal.SIGKILL)  # mid-pass, perhaps: its transaction rolls back
        else:
            victim.send_signal(signal.SIGTERM)
        victim.wait(30)
        workers.append(_started(spawn_worker))
        turn += 1
    # Stop the scheduling, then let one worker finish what was enqueued. The
    # finisher declares no schedules: one that still ticked could enqueue a job
    # between the last look at the queue and its own stop, left queued.
    for worker in workers:
        worker.send_signal(signal.SIGTERM)
    for worker in workers:
        assert worker.wait(30) == 0, output_of(worker)
    monkeypatch.setenv("LEASEQ_TEST_SCHEDULES", "0")
    finisher = _started(spawn_worker)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        (stats,) = [s for s in queue.stats() if s.queue == "ticks"]
        if stats.queued == 0 and stats.running == 0:
            break
        time.sleep(0.5)
    finisher.send_signal(signal.SIGTERM)
    finisher.wait(30)

    jobs = _keys(queue, "SELECT idempotency_key FROM {schema}.job WHERE queue = 'ticks'")
    doubled = [key for key, count in jobs.items() if count > 1]
    assert not doubled, doubled[:10]
    effects = _keys(queue, "SELECT idempotency_key FROM {schema}.effect")
    assert not [key for key, count in effects.items() if count > 1]
    assert set(effects) == set(jobs)  # every tick's job ran, once
    # No tick lost: each schedule's ticks are every second from its first to its last.
    by_schedule: dict[str, list[datetime]] = {}
    for key in jobs:
        name, _, at = key.partition("@")
        by_schedule.setdefault(name, []).append(datetime.fromisoformat(at))
    assert len(by_schedule) == SCHEDULES
    for name, ticks in by_schedule.items():
        ticks.sort()
        gaps = [b for a, b in itertools.pairwise(ticks) if b - a != timedelta(seconds=1)]
        assert not gaps, (name, gaps[:5])
        assert len(ticks) >= RUN_SECONDS - 10, (name, len(ticks))
    infos = {s.name: s for s in queue.schedules()}
    assert sum(s.enqueued for s in infos.values()) == len(jobs)
    assert sum(s.skipped for s in infos.values()) == 0
