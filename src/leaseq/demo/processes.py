"""The demo's processes: the HTTP service (uvicorn) and the worker processes."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType

import httpx

import leaseq

from . import SCHEMA


class Terminated(BaseException):
    """SIGTERM, raised in the main thread as Ctrl-C raises KeyboardInterrupt: the
    demo's ``finally`` blocks then stop its children, which live in sessions of
    their own and get no signal of the demo's. (A BaseException, as
    KeyboardInterrupt: no ``except Exception`` on the way may swallow it.)"""


class _Held:
    """Whether the stop signals are held back now, and the first that came meanwhile."""

    depth = 0
    pending: int | None = None


def _raise_for(signum: int) -> None:
    if signum == signal.SIGINT:
        raise KeyboardInterrupt
    raise Terminated


def _on_stop_signal(signum: int, frame: FrameType | None) -> None:
    if _Held.depth:
        _Held.pending = _Held.pending or signum
        return
    _raise_for(signum)


@contextmanager
def stop_signals() -> Iterator[None]:
    """For the block, SIGTERM raises Terminated and Ctrl-C KeyboardInterrupt, both
    held back by :func:`stop_signals_held`; the previous handlers afterwards."""
    previous = {
        signum: signal.signal(signum, _on_stop_signal) for signum in (signal.SIGINT, signal.SIGTERM)
    }
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        _Held.pending = None


@contextmanager
def stop_signals_held() -> Iterator[None]:
    """Hold SIGTERM and Ctrl-C back for the block, raised at its end: a child just
    started must be recorded, and every child sent its stop, before a signal can
    interrupt (a second one during cleanup skipped stopping the children after
    the first). A flag, not a signal mask: a mask is per thread, and the pool's
    threads would take the signal for the main thread's handler all the same."""
    _Held.depth += 1
    try:
        yield
    finally:
        _Held.depth -= 1
    # Only when the block ended normally: an exception in flight stops things already.
    if not _Held.depth and _Held.pending is not None:
        signum, _Held.pending = _Held.pending, None
        _raise_for(signum)


def _stop(processes: list[subprocess.Popen[bytes]], timeout: float) -> None:
    """SIGTERM each of ``processes``, then wait up to ``timeout`` for each (SIGKILL
    past it). A signal meanwhile (a second Ctrl-C) kills those left: the user
    asks to hurry, and every one must still end."""
    try:
        with stop_signals_held():
            for process in processes:
                if process.poll() is None:
                    process.send_signal(signal.SIGTERM)
        for process in processes:
            try:
                process.wait(timeout)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(10)
    except BaseException:
        with stop_signals_held():
            for process in processes:
                if process.poll() is None:
                    process.kill()
                    process.wait(10)
        raise


@contextmanager
def serving(database_url: str, port: int, logs: Path) -> Iterator[str]:
    """The HTTP service in its own process (uvicorn); yields its base URL.

    The listening socket is made here and handed over, so the port is known
    before the server starts and there is no race for it.
    """
    sock = socket.socket()
    # Accepted connections inherit this: no Nagle delay between headers and body.
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(("127.0.0.1", port))
    except OSError as exc:
        sock.close()
        raise leaseq.InvalidArgument(
            f"cannot serve on 127.0.0.1:{port} ({exc.strerror}); try --port 0"
        ) from None
    sock.listen(128)
    base_url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    started: list[subprocess.Popen[bytes]] = []
    try:
        with open(logs / "service.log", "wb") as log, stop_signals_held():
            # Held: a signal must not come between the start and the record of it.
            started.append(
                subprocess.Popen(
                    [
                        sys.executable,
                        "-m",
                        "uvicorn",
                        "leaseq.demo.service:app_from_environment",
                        "--factory",
                        "--fd",
                        str(sock.fileno()),
                        "--log-level",
                        "warning",
                    ],
                    env={**os.environ, "LEASEQ_DEMO_DATABASE_URL": database_url},
                    pass_fds=[sock.fileno()],
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    # Ctrl-C reaches the demo, which stops its children once.
                    start_new_session=True,
                )
            )
        _wait_until_serving(base_url, started[0], logs / "service.log")
        yield base_url
    finally:
        _stop(started, 15)
        sock.close()


def _wait_until_serving(base_url: str, server: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 60
    while True:
        try:
            if httpx.get(f"{base_url}/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if server.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"the demo service did not start; see {log}")
        time.sleep(0.1)


class Workers:
    """`leaseq worker` processes for the demo app."""

    def __init__(self, database_url: str, concurrency: int, logs: Path) -> None:
        self.database_url = database_url
        self.concurrency = concurrency
        self.logs = logs
        self.processes: list[subprocess.Popen[bytes]] = []

    def start(self) -> subprocess.Popen[bytes]:
        # Workers run niced, as background work should: the CPU-heavy reports must
        # not slow the HTTP service down on a small machine.
        nice = ["nice", "-n", "10"] if shutil.which("nice") else []
        log = self.logs / f"worker-{len(self.processes)}.log"
        # Held: a signal must not come between the start and the record that stop() reads.
        with open(log, "wb") as output, stop_signals_held():
            process = subprocess.Popen(
                [
                    *nice,
                    sys.executable,
                    "-m",
                    "leaseq",
                    "worker",
                    "leaseq.demo.jobs:app",
                    "--schema",
                    SCHEMA,
                    "--concurrency",
                    str(self.concurrency),
                    "--poll-interval",
                    "0.5",
                    "--shutdown-grace",
                    "10",
                ],
                env={**os.environ, "DATABASE_URL": self.database_url},
                stdout=output,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            self.processes.append(process)
        return process

    def wait_ready(self, timeout: float = 60.0) -> None:
        """Until every worker logged that it started (imports and pools take a moment)."""
        deadline = time.monotonic() + timeout
        for number, process in enumerate(self.processes):
            log = self.logs / f"worker-{number}.log"
            while "worker started" not in log.read_text(errors="replace"):
                if process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"worker {number} did not start; see {log}")
                time.sleep(0.05)

    def stop(self) -> None:
        """SIGTERM every worker, then wait for each to finish its jobs."""
        _stop(self.processes, 30)
