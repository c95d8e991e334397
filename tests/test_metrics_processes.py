"""`leaseq worker --metrics-port`: real processes serve /metrics over HTTP."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

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
    command = [
        *(sys.executable, "-m", "leaseq", "maintenance", "--schema", queue.schema),
        *("--interval", "0.5", "--metrics-port", str(port)),
    ]
    with _stopped_at_the_end(command, ROOT, {**os.environ, "DATABASE_URL": database_url}):
        jobs = _scrape(port)["leaseq_queue_jobs"]
        assert jobs[(("queue", "work"), ("state", "queued"))] == 3
        assert jobs[(("queue", "work"), ("state", "done"))] == 1


@pytest.mark.parametrize("taken", ["port", "host"])
def test_maintenance_says_in_one_line_that_it_cannot_serve_its_metrics(
    queue: leaseq.Queue, database_url: str, taken: str
) -> None:
    """As the worker does: it printed a traceback (OSError, socket.gaierror)."""
    port = _two_free_ports()
    host = "127.0.0.1" if taken == "port" else "nosuchhost.invalid"
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", port))
        squatter.listen()
        command = [
            *(sys.executable, "-m", "leaseq", "maintenance", "--schema", queue.schema),
            *("--metrics-port", str(port), "--metrics-host", host),
        ]
        env = {**os.environ, "DATABASE_URL": database_url}
        done = subprocess.run(
            command, check=False, cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
        )
    assert done.returncode == 1, done.stderr
    assert done.stderr.startswith(f"error: --metrics-port: cannot serve on {host}:{port} ("), (
        done.stderr
    )
    assert "Traceback" not in done.stderr


@contextlib.contextmanager
def _stopped_at_the_end(command: list[str], cwd: Path, env: dict[str, str]) -> Iterator[None]:
    """Run ``command`` for the block; then SIGTERM, which must end it cleanly (else
    it is killed and the test fails)."""
    process = subprocess.Popen(
        command, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        yield
        process.send_signal(signal.SIGTERM)
        assert process.wait(20) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(10)
        if process.stdout:
            process.stdout.close()


#: An app that names its own database and schema, as a deployment's module does.
_OWN_APP = """
import leaseq

app = leaseq.App({dsn!r}, schema={schema!r})


@app.task("work")
def work(job: leaseq.JobContext) -> None:
    pass
"""


def test_the_database_gauges_come_from_the_apps_schema_and_the_workers_database(
    queue: leaseq.Queue, database_url: str, tmp_path: Path
) -> None:
    """Not from --schema's default ("leaseq") and the command's own URL: the worker
    serves gauges of the schema and database it works (here the command's URL is
    a dead one, which nothing but the gauges would read)."""
    (tmp_path / "own_app.py").write_text(_OWN_APP.format(dsn=database_url, schema=queue.schema))
    queue.enqueue("work", {}, delay=3600)  # stays queued: the gauge has something to count
    port = _two_free_ports()
    env = {k: v for k, v in os.environ.items() if k not in ("LEASEQ_SCHEMA", "LEASEQ_DATABASE_URL")}
    command = [
        *(sys.executable, "-m", "leaseq", "worker", "own_app:app", "--no-listen"),
        *("--poll-interval", "0.2", "--metrics-port", str(port)),
    ]
    dead = {**env, "DATABASE_URL": "postgresql://postgres@127.0.0.1:1/nowhere"}
    with _stopped_at_the_end(command, tmp_path, dead):
        scraped = _scrape(port)
        assert scraped["leaseq_queue_stats_up"][()] == 1
        assert scraped["leaseq_queue_jobs"][(("queue", "work"), ("state", "queued"))] == 1


def test_metrics_ports_past_65535_are_one_clear_error_before_any_worker_starts(
    queue: leaseq.Queue, spawn_worker: Spawn
) -> None:
    """PORT + 1 = 65536 is no port (the early check's probe wrapped it to 0, any
    port, and the second process then crashed at start, restarted forever)."""
    worker = spawn_worker("--processes", "2", "--metrics-port", "65535")
    assert worker.wait(60) == 1
    output = output_of(worker)
    assert "error: --metrics-port 65535 with --processes 2 needs ports up to 65536" in output
    assert "Traceback" not in output
    assert "started worker" not in output
