"""`leaseq worker` processes for tests: started on the test's schema, always killed after."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

from .conftest import ROOT

Spawn = Callable[..., subprocess.Popen[str]]

#: Where each started process writes its stdout and stderr, by pid: a file, not a
#: pipe nobody reads until the end (a chatty process would fill a pipe's 64 KiB
#: and block on its next log line, stopping a shutdown the test waits for).
_OUTPUTS: dict[int, Path] = {}


def output_of(process: subprocess.Popen[str]) -> str:
    """Everything the process wrote so far (stdout and stderr together)."""
    return _OUTPUTS[process.pid].read_text(errors="replace")


@contextlib.contextmanager
def worker_processes(database_url: str, schema: str, *, own_session: bool) -> Iterator[Spawn]:
    """Yield ``spawn(*arguments)``; every process it started is killed on exit.

    With ``own_session`` each process leads a process group of its own (as under a
    terminal or systemd), and the whole group is killed, its children included.
    """
    started: list[subprocess.Popen[str]] = []
    folder = Path(tempfile.mkdtemp(prefix="leaseq-worker-output-"))

    def spawn(*arguments: str) -> subprocess.Popen[str]:
        log = folder / f"{len(started)}.log"
        with log.open("w") as output:
            process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "leaseq",
                    "worker",
                    "tests.worker_app:app",
                    "--schema",
                    schema,
                    "--poll-interval",
                    "0.2",
                    *arguments,
                ],
                cwd=ROOT,
                env={**os.environ, "DATABASE_URL": database_url, "LEASEQ_SCHEMA": schema},
                stdout=output,
                stderr=subprocess.STDOUT,
                text=True,
                start_new_session=own_session,
            )
        _OUTPUTS[process.pid] = log
        started.append(process)
        return process

    try:
        yield spawn
    finally:
        for process in started:
            if own_session:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)  # the group we created
            elif process.poll() is None:
                process.kill()
            process.wait(10)
            _OUTPUTS.pop(process.pid, None)
        shutil.rmtree(folder, ignore_errors=True)
