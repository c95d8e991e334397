"""`leaseq worker --metrics-port`: real processes serve /metrics over HTTP."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest
from prometheus_client.parser import text_string_to_metric_families

import leaseq

from .conftest import ROOT
from .worker_app import TABLES
from .worker_processes import Spawn, output_of, worker_processes


@pytest.fixture
def spawn_worker(database_url: str, schema: str) -> Iterator[Spawn]:
    with worker_processes(database_url, schema, own_session=False) as spawn:
        yield spawn


def _two_free_ports() -> int:
    """A port P with P and P + 1 free right now."""
    for _ in range(50):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = int(probe.getsockname()[1])
        try:
            with socket.socket() as next_one:
                next_one.bind(("127.0.0.1", port + 1))
        except OSError:
            continue
        return port
    pytest.fail("no two free ports in a row")


Scraped = dict[str, dict[tuple[tuple[str, str], ...], float]]


def _scrape(port: int, timeout: float = 30.0) -> Scraped:
    """name -> labels -> value, once the process serves /metrics."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
                text = r.read().decode()
            break
        except (urllib.error.URLError, ConnectionError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)
    found: Scraped = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
    return found


def test_each_worker_process_serves_metrics_and_the_first_the_database_gauges(
    queue: leaseq.Queue, spawn_worker: Spawn
) -> None:
    with queue.connection() as conn:
        for statement in TABLES:
            conn.execute(statement.format(schema=f'"{queue.schema}"'))
    queue.enqueue_many("work", [{} for _ in range(6)])
    port = _two_free_ports()
    worker = spawn_worker("--processes", "2", "--metrics-port", str(port))
    done = (("outcome", "done"), ("queue", "work"))
    deadline = time.monotonic() + 30
    while True:
        first, second = _scrape(port), _scrape(port + 1)
        finished = [s.get("leaseq_jobs_finished_total", {}).get(done, 0.0) for s in (first, second)]
        gauge = first.get("leaseq_queue_jobs", {}).get((("queue", "work"), ("state", "done")))
        if sum(finished) == 6 and gauge == 6:
            break
        assert time.monotonic() < deadline, (finished, gauge)
        time.sleep(0.2)
    assert "leaseq_queue_jobs" not in second  # the database gauges once, not per process
    assert first["leaseq_worker_running_jobs"][()] == 0
    worker.send_signal(signal.SIGTERM)
    assert worker.wait(30) == 0


@pytest.mark.parametrize("processes", ["1", "2"])
def test_a_metrics_port_taken_is_one_clear_error_before_any_worker_starts(
    queue: leaseq.Queue, spawn_worker: Spawn, processes: str
) -> None:
    """Not a child crashing at start and restarted forever (the worker a process short)."""
    port = _two_free_ports()
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", port + int(processes) - 1))  # the last process's port
        squatter.listen()
        worker = spawn_worker("--processes", processes, "--metrics-port", str(port))
        assert worker.wait(60) == 1
    output = output_of(worker)
    assert f"--metrics-port: cannot serve on 127.0.0.1:{port + int(processes) - 1}" in output
    assert "Traceback" not in output
    assert "restarting" not in output


def test_maintenance_serves_the_database_gauges(queue: leaseq.Queue, database_url: str) -> None:
    queue.enqueue_many("work", [{} for _ in range(4)])
    queue.complete(queue.claim("work")[0])
    port = _two_free_ports()
    process = subprocess.Popen(
        [
            *(sys.executable, "-m", "leaseq", "maintenance", "--schema", queue.schema),
            *("--interval", "0.5", "--metrics-port", str(port)),
        ],
        cwd=ROOT,
        env={**os.environ, "DATABASE_URL": database_url},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        jobs = _scrape(port)["leaseq_queue_jobs"]
        assert jobs[(("queue", "work"), ("state", "queued"))] == 3
        assert jobs[(("queue", "work"), ("state", "done"))] == 1
        process.send_signal(signal.SIGTERM)
        assert process.wait(20) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(10)
        if process.stdout:
            process.stdout.close()
