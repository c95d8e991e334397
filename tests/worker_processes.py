"""`leaseq worker` processes for tests: started on the test's schema, always killed after."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator

from .conftest import ROOT

Spawn = Callable[..., subprocess.Popen[str]]


@contextlib.contextmanager
def worker_processes(database_url: str, schema: str, *, own_session: bool) -> Iterator[Spawn]:
    """Yield ``spawn(*arguments)``; every process it started is killed on exit.

    With ``own_session`` each process leads a process group of its own (as under a
    terminal or systemd), and the whole group is killed, its children included.
    """
    started: list[subprocess.Popen[str]] = []

    def spawn(*arguments: str) -> subprocess.Popen[str]:
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
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=own_session,
        )
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
            if process.stdout:
                process.stdout.close()
