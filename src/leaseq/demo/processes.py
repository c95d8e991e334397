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

import httpx

import leaseq

from . import SCHEMA


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
    log = open(logs / "service.log", "wb")  # noqa: SIM115
    server = subprocess.Popen(
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
        start_new_session=True,  # Ctrl-C reaches the demo, which stops its children once
    )
    log.close()
    try:
        _wait_until_serving(base_url, server, logs / "service.log")
        yield base_url
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(15)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait(5)
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
        log = open(self.logs / f"worker-{len(self.processes)}.log", "wb")  # noqa: SIM115
        # Workers run niced, as background work should: the CPU-heavy reports must
        # not slow the HTTP service down on a small machine.
        nice = ["nice", "-n", "10"] if shutil.which("nice") else []
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
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
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
        for process in self.processes:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in self.processes:
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(10)
