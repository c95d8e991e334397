"""Real worker processes: kill -9, SIGTERM, a second signal, a crashing child."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import leaseq
from leaseq import JobStatus
from leaseq._worker.signals import ECHO_WINDOW

from .conftest import ROOT
from .worker_app import TABLES
from .worker_processes import Spawn, output_of, worker_processes


@pytest.fixture
def setup_tables(queue: leaseq.Queue) -> leaseq.Queue:
    with queue.connection() as conn:
        for statement in TABLES:
            conn.execute(statement.format(schema=f'"{queue.schema}"'))
    return queue


@pytest.fixture
def spawn_worker(database_url: str, schema: str) -> Iterator[Spawn]:
    with worker_processes(database_url, schema, own_session=False) as spawn:
        yield spawn


def _wait(condition: Callable[[], bool], timeout: float = 30.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"{what} not reached within {timeout}s")
        time.sleep(0.1)


def _scalar(queue: leaseq.Queue, sql: str, *params: Any) -> Any:
    with queue.connection() as conn:
        row = conn.execute(sql.replace("{schema}", f'"{queue.schema}"'), params).fetchone()
    assert row is not None
    return row[0]


def _attempts_logged(queue: leaseq.Queue, job_id: int) -> int:
    return int(
        _scalar(queue, "SELECT count(*) FROM {schema}.attempt_log WHERE job_id = %s", job_id)
    )


def _effects(queue: leaseq.Queue) -> dict[int, int]:
    with queue.connection() as conn:
        rows = conn.execute(
            f'SELECT job_id, count(*) FROM "{queue.schema}".effect GROUP BY job_id'
        ).fetchall()
    return dict(rows)


def test_kill_9_mid_job_is_recovered_by_another_worker(
    setup_tables: leaseq.Queue, spawn_worker: Spawn
) -> None:
    queue = setup_tables
    job_id = queue.enqueue("work", {"sleep": 60})
    first = spawn_worker("--lease", "2", "--concurrency", "1")
    _wait(lambda: _attempts_logged(queue, job_id) == 1, what="first attempt started")
    first.send_signal(signal.SIGKILL)
    first.wait(10)
    assert queue.get(job_id).status is JobStatus.RUNNING  # its lease is still held
    second = spawn_worker("--lease", "2", "--concurrency", "1")
    _wait(lambda: queue.get(job_id).status is JobStatus.DONE, what="job done by the second")
    job = queue.get(job_id)
    assert (job.attempts, job.lease_version) == (2, 2)
    assert job.history[0]["outcome"] == "lease_expired"
    assert _effects(queue) == {job_id: 1}
    second.send_signal(signal.SIGTERM)
    assert second.wait(30) == 0


def test_repeated_crashes_end_failed_and_crashed_children_restart(
    setup_tables: leaseq.Queue, spawn_worker: Spawn
) -> None:
    queue = setup_tables
    crasher = queue.enqueue("work", {"crash": True}, max_attempts=3)
    normal = queue.enqueue_many("work", [{} for _ in range(10)])
    supervisor = spawn_worker("--processes", "2", "--lease", "1", "--maintenance-interval", "0.3")
    _wait(
        lambda: queue.get(crasher).status is JobStatus.FAILED,
        timeout=60,
        what="the crashing job failed",
    )
    _wait(
        lambda: all(queue.get(i).status is JobStatus.DONE for i in normal),
        what="the other jobs done",
    )
    job = queue.get(crasher)
    assert job.attempts == 3
    assert _attempts_logged(queue, crasher) == 3  # each attempt killed its process
    assert "lease expired" in (job.last_error or "")
    supervisor.send_signal(signal.SIGTERM)
    assert supervisor.wait(60) == 0
    output = output_of(supervisor)
    assert output.count("restarting") >= 3, output
    assert _effects(queue) == dict.fromkeys(normal, 1)


def test_sigterm_finishes_or_releases_running_jobs(
    setup_tables: leaseq.Queue, spawn_worker: Spawn
) -> None:
    queue = setup_tables
    short = queue.enqueue_many("work", [{"sleep": 0.5} for _ in range(2)])
    long = queue.enqueue_many("work", [{"sleep": 120} for _ in range(2)])
    worker = spawn_worker("--concurrency", "4", "--shutdown-grace", "2")
    _wait(
        lambda: all(_attempts_logged(queue, i) == 1 for i in short + long),
        what="all four jobs started",
    )
    worker.send_signal(signal.SIGTERM)
    assert worker.wait(30) == 0
    for job_id in short:
        assert queue.get(job_id).status is JobStatus.DONE
    for job_id in long:
        job = queue.get(job_id)
        assert (job.status, job.attempts) == (JobStatus.QUEUED, 0)
        assert job.history[-1]["outcome"] == "released"
    (stats,) = queue.stats("work")
    assert stats.running == 0


@pytest.mark.parametrize("processes", ["1", "2"])
def test_second_signal_exits_at_once(
    setup_tables: leaseq.Queue, spawn_worker: Spawn, processes: str
) -> None:
    """A second signal leaves the running jobs to their leases: the exit code says
    the stop was not clean (under --processes N, the supervisor's said 0)."""
    queue = setup_tables
    job_id = queue.enqueue("work", {"sleep": 120})
    worker = spawn_worker("--shutdown-grace", "60", "--processes", processes)
    _wait(lambda: _attempts_logged(queue, job_id) == 1, what="job started")
    worker.send_signal(signal.SIGTERM)
    time.sleep(0.5)
    assert worker.poll() is None  # still within its grace period
    worker.send_signal(signal.SIGINT)
    assert worker.wait(15) != 0
    # Not released: its lease will expire and another worker will recover it.
    assert queue.get(job_id).status is JobStatus.RUNNING


def test_bad_app_reference_is_one_clear_line(database_url: str, schema: str) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "leaseq", "worker", "tests.no_such_module:app"],
        cwd=ROOT,
        env={**os.environ, "DATABASE_URL": database_url},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 1
    assert result.stderr.strip().startswith("error: cannot import 'tests.no_such_module'")
    assert len(result.stderr.strip().splitlines()) == 1


def _setup_failure(url: str, processes: str, *options: str) -> tuple[int, list[str], str]:
    """A worker that cannot run as set up: its exit code, its error lines, its stderr."""
    result = subprocess.run(
        [
            *(sys.executable, "-m", "leaseq", "worker", "tests.worker_app:app"),
            *("--processes", processes, *options),
        ],
        cwd=ROOT,
        env={**os.environ, "DATABASE_URL": url},
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    # One line per child that got that far: the first to fail stops the others.
    assert 1 <= len(errors) <= int(processes), result.stderr
    assert "Traceback" not in result.stderr
    return result.returncode, errors, result.stderr + result.stdout


@pytest.mark.parametrize(("processes", "code"), [("1", 1), ("2", 78)])
def test_a_worker_on_a_schema_never_migrated_says_so_in_one_line_and_stops(
    database_url: str, schema: str, processes: str, code: int
) -> None:
    """It printed a 150-line traceback ("a worker service crashed"), and with
    --processes its supervisor restarted the children for ever."""
    returncode, errors, output = _setup_failure(
        database_url, processes, "--schema", schema + "_never"
    )
    assert returncode == code, output
    assert "leaseq migrate" in errors[0]


@pytest.mark.parametrize(("processes", "code"), [("1", 1), ("2", 78)])
def test_a_worker_given_a_malformed_database_url_says_so_in_one_line_and_stops(
    processes: str, code: int
) -> None:
    """No connection can ever be made with it. The LISTEN session's raw driver
    error crashed the worker with a traceback (without LISTEN its claims retried
    the URL for ever), and with --processes the supervisor restarted the children."""
    malformed = "postgresql://app:Sekr1t@127.0.0.1:5432/app?bogus_option=1"
    returncode, errors, output = _setup_failure(malformed, processes)
    assert returncode == code, output
    assert "invalid database URL" in errors[0]
    assert "Sekr1t" not in output


@pytest.mark.parametrize(("processes", "code"), [("1", 1), ("2", 78)])
@pytest.mark.parametrize(
    "refused",
    [
        ("--queues", "nope", "nope"),
        ("--schema", "Bad-Name", "schema"),
    ],
)
def test_a_worker_given_a_setting_it_refuses_says_so_in_one_line_and_stops(
    database_url: str, processes: str, code: int, refused: tuple[str, str, str]
) -> None:
    """Under --processes each child raised it as a crash: tracebacks, and the
    supervisor restarted them for ever."""
    option, value, said = refused
    returncode, errors, output = _setup_failure(database_url, processes, option, value)
    assert returncode == code, output
    assert said in errors[0]
    assert "restarting" not in output


@pytest.mark.parametrize("processes", ["1", "2"])
def test_the_app_module_is_imported_from_the_current_directory(
    queue: leaseq.Queue, database_url: str, tmp_path: Path, processes: str
) -> None:
    """`leaseq worker myjobs:app` where myjobs.py is, as the README runs it, with no
    PYTHONPATH=. (as `python -m`, uvicorn and celery do): the parent's early check
    of the reference failed with "cannot import" before anything put the current
    directory on the path."""
    (tmp_path / "cwd_jobs.py").write_text(
        "import leaseq\n\napp = leaseq.App()\n\n\n"
        "@app.task('work')\ndef work(job: leaseq.JobContext) -> None:\n    pass\n"
    )
    job_id = queue.enqueue("work", {})
    leaseq_itself = str(Path(leaseq.__file__).resolve().parent.parent)
    result = subprocess.run(
        # -P: `python -m` puts the current directory on the path by itself; the
        # `leaseq` script does not.
        [
            *(sys.executable, "-P", "-m", "leaseq", "worker", "cwd_jobs:app", "--burst"),
            *("--no-listen", "--processes", processes, "--schema", queue.schema),
        ],
        cwd=tmp_path,
        env={**os.environ, "DATABASE_URL": database_url, "PYTHONPATH": leaseq_itself},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert queue.get(job_id).status is JobStatus.DONE


def test_maintenance_as_its_own_process(queue: leaseq.Queue, clock: Any, database_url: str) -> None:
    job_id = queue.enqueue("work", {}, max_attempts=1)
    queue.claim("work", lease=5)
    clock.advance(6)  # the only attempt's lease ran out
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "leaseq",
            "maintenance",
            "--interval",
            "0.2",
            "--schema",
            queue.schema,
        ],
        cwd=ROOT,
        env={**os.environ, "DATABASE_URL": database_url},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        _wait(lambda: queue.get(job_id).status is JobStatus.FAILED, what="reaped")
        process.send_signal(signal.SIGTERM)
        assert process.wait(20) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(10)
        if process.stdout:
            process.stdout.close()


@pytest.mark.parametrize("processes", ["1", "2"])
def test_burst_worker_runs_what_is_claimable_and_exits(
    setup_tables: leaseq.Queue, spawn_worker: Spawn, processes: str
) -> None:
    queue = setup_tables
    ids = queue.enqueue_many("work", [{} for _ in range(25)])
    later = queue.enqueue("work", {}, delay=3600)
    # Under --processes a child that is done is not restarted: the whole exits.
    process = spawn_worker("--burst", "--concurrency", "4", "--processes", processes)
    assert process.wait(60) == 0, output_of(process)
    effects = _effects(queue)
    missing = [queue.get(job_id) for job_id in ids if effects.get(job_id) != 1]
    # each ran once, with its effect
    assert effects == dict.fromkeys(ids, 1), "\n".join(
        [
            f"job {job.job_id} {job.status.value}, attempts {job.attempts}: {job.history}"
            for job in missing
        ]
        + [line for line in output_of(process).splitlines() if "WARNING" in line or "ERROR" in line]
    )
    assert queue.get(later).status is JobStatus.QUEUED  # not claimable yet: left alone


def test_a_cli_worker_runs_process_handlers_in_its_children(
    setup_tables: leaseq.Queue, spawn_worker: Spawn
) -> None:
    queue = setup_tables
    ids = queue.enqueue_many("cpu", [{} for _ in range(6)])
    process = spawn_worker("--burst", "--queues", "cpu", "--concurrency", "2")
    assert process.wait(90) == 0, output_of(process)
    assert _effects(queue) == dict.fromkeys(ids, 1)
    pids = {queue.result(job_id) for job_id in ids}
    assert process.pid not in pids
    assert 1 <= len(pids) <= 2  # a child per slot, reused


def test_a_cli_worker_without_durable_acknowledgements_runs_each_job_once(
    setup_tables: leaseq.Queue, spawn_worker: Spawn
) -> None:
    queue = setup_tables
    ids = queue.enqueue_many("work", [{} for _ in range(12)])
    process = spawn_worker("--burst", "--concurrency", "4", "--no-durable-acknowledgements")
    assert process.wait(60) == 0, output_of(process)
    assert _effects(queue) == dict.fromkeys(ids, 1)
    assert {queue.get(job_id).status for job_id in ids} == {JobStatus.DONE}


@pytest.mark.server_agnostic  # the worker's cancellation and exit
@pytest.mark.parametrize("signals", [1, 2])
def test_a_handler_deaf_to_cancellation_cannot_keep_a_stopped_worker_alive(
    queue: leaseq.Queue, spawn_worker: Spawn, signals: int
) -> None:
    """Its task swallows every cancellation, for two minutes. One stop signal: the
    grace period, the releases' wait, then the worker leaves it (as it leaves a
    sync handler's thread). A second signal: the worker leaves at once."""
    job_id = queue.enqueue("deaf", {"for": 120})
    worker = spawn_worker("--shutdown-grace", "1")
    _wait(lambda: queue.get(job_id).status is JobStatus.RUNNING, what="job started")
    worker.send_signal(signal.SIGTERM)
    if signals == 2:
        time.sleep(0.5)
        worker.send_signal(signal.SIGTERM)
    try:
        code = worker.wait(45)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the worker did not exit:\n{output_of(worker)}")
    assert (code != 0) is (signals == 2), output_of(worker)
    # Never acknowledged: its lease will expire and another worker will recover it.
    assert queue.get(job_id).status is JobStatus.RUNNING


def test_a_worker_whose_log_reader_is_gone_still_stops_gracefully(
    database_url: str, schema: str, setup_tables: leaseq.Queue
) -> None:
    """`leaseq worker ... 2>&1 | head -1`, or a log collector that went away: the
    log's pipe is closed. Rich's console exited the process on its next log line
    (the "stopping" line of a SIGTERM), the running job neither finished nor given
    back. The worker goes on without its log: the job finishes within the grace."""
    queue = setup_tables
    job_id = queue.enqueue("work", {"sleep": 2})
    reader, writer = os.pipe()
    worker = subprocess.Popen(
        [sys.executable, "-m", "leaseq", "worker", "tests.worker_app:app", "--schema", schema],
        cwd=ROOT,
        env={**os.environ, "DATABASE_URL": database_url, "LEASEQ_SCHEMA": schema},
        stdout=writer,
        stderr=writer,
    )
    os.close(writer)
    try:
        _wait(lambda: _attempts_logged(queue, job_id) == 1, what="the job's start")
        os.close(reader)  # nobody reads the log any more
        worker.send_signal(signal.SIGTERM)  # logs "stopping: ..."
        assert worker.wait(30) == 0
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait(10)
    assert queue.get(job_id).status is JobStatus.DONE


def _running(pid: int) -> bool:
    """Whether ``pid`` names a live process (a zombie left unreaped is none)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _children_of(pid: int) -> set[int]:
    """The live processes whose parent is ``pid`` (its workers, its resource tracker)."""
    children = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid and fields[0] != "Z":
            children.add(int(entry))
    return children


def _kill_supervisor_and_wait_for_its_children(supervisor: subprocess.Popen[str]) -> None:
    """SIGKILL the supervisor once both its workers were started; every process
    it had started must then end by itself (none is left running for ever)."""
    _wait(lambda: "started worker 1" in output_of(supervisor), what="both workers started")
    children = _children_of(supervisor.pid)
    assert len(children) >= 2, output_of(supervisor)
    supervisor.send_signal(signal.SIGKILL)
    supervisor.wait(10)
    _wait(
        lambda: not any(_running(child) for child in children),
        timeout=40,
        what=f"the orphaned processes {sorted(children)} stopped",
    )


@pytest.mark.server_agnostic  # the supervisor's children and their signals
def test_children_of_a_supervisor_killed_outright_stop_and_give_their_jobs_back(
    setup_tables: leaseq.Queue, database_url: str, schema: str
) -> None:
    """A supervisor killed with SIGKILL (the OOM killer) can stop no child: a child
    that ran on was out of reach of every stop (the next supervisor's included),
    working beside that supervisor's new children for ever. Each stops as on a
    SIGTERM: its running job, past the grace, is given back, and no other child
    runs it meanwhile."""
    queue = setup_tables
    job_id = queue.enqueue("work", {"sleep": 120})
    with worker_processes(database_url, schema, own_session=True) as spawn:
        supervisor = spawn("--processes", "2", "--shutdown-grace", "1")
        _wait(lambda: _attempts_logged(queue, job_id) == 1, what="the job started")
        _kill_supervisor_and_wait_for_its_children(supervisor)
    job = queue.get(job_id)
    assert (job.status, job.attempts) == (JobStatus.QUEUED, 0), job.history
    assert job.history[-1]["outcome"] == "released"
    assert _effects(queue) == {}


@pytest.mark.server_agnostic  # the supervisor's children and their signals
def test_children_still_starting_when_their_supervisor_is_killed_stop_too(
    queue: leaseq.Queue, database_url: str, schema: str
) -> None:
    """The supervisor killed while its children were still starting (importing,
    before any job): a child that only then looked for its parent found the
    adopting process and never noticed the loss; it worked on unsupervised."""
    with worker_processes(database_url, schema, own_session=True) as spawn:
        supervisor = spawn("--processes", "2")
        _kill_supervisor_and_wait_for_its_children(supervisor)


@pytest.mark.server_agnostic  # the supervisor's children and their signals
def test_a_supervisor_killed_during_its_graceful_stop_leaves_that_stop_graceful(
    setup_tables: leaseq.Queue, database_url: str, schema: str
) -> None:
    """SIGTERM, then (the stop taking long) a kill -9 of the supervisor. Its
    children, stopping gracefully already, took the loss of their supervisor for
    a second signal and left at once, their running jobs neither finished nor
    given back (left to their leases)."""
    queue = setup_tables
    job_id = queue.enqueue("work", {"sleep": 120})
    with worker_processes(database_url, schema, own_session=True) as spawn:
        supervisor = spawn("--processes", "2", "--shutdown-grace", "3")
        _wait(lambda: _attempts_logged(queue, job_id) == 1, what="the job started")
        # (Their stop handlers set: a SIGTERM before ends a worker at once.)
        _wait(lambda: output_of(supervisor).count("worker started") == 2, what="both running")
        children = _children_of(supervisor.pid)
        supervisor.send_signal(signal.SIGTERM)
        _wait(lambda: output_of(supervisor).count("stopping:") == 2, what="both stopping")
        time.sleep(ECHO_WINDOW + 0.2)  # what comes now is no echo of the stop signal
        supervisor.send_signal(signal.SIGKILL)
        supervisor.wait(10)
        _wait(lambda: not any(map(_running, children)), timeout=40, what="the children stopped")
    job = queue.get(job_id)
    assert (job.status, job.attempts) == (JobStatus.QUEUED, 0), job.history
    assert job.history[-1]["outcome"] == "released"
