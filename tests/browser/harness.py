"""What the browser tests stand on: an ASGI app served by uvicorn from a thread
on a free loopback port, Debian's Chromium driven by Playwright, screenshots
under test-artifacts/screenshots/, and real `leaseq worker` processes.

Chromium is the system's (/usr/bin/chromium, `.ci/run` installs it), never a
browser build of Playwright's own. Every wait is bounded.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import uvicorn

from ..conftest import ROOT

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
SCREENSHOTS = ROOT / "test-artifacts" / "screenshots"
#: A laptop's screen.
VIEWPORT = {"width": 1366, "height": 860}
#: Playwright's timeout for one step (a click, a wait for an element), in ms.
STEP_MS = 15_000


def wait_for(condition: Callable[[], Any], *, timeout: float = 30.0, what: str) -> Any:
    """Poll ``condition`` until it is truthy (and return it), else fail the test."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"{what}: not within {timeout}s")
        time.sleep(0.1)


@dataclass
class Served:
    url: str
    loop: asyncio.AbstractEventLoop

    def run(self, coroutine: Any, timeout: float = 10.0) -> Any:
        """Run a coroutine on the server's loop (where the app's pools live)."""
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout)


@contextlib.contextmanager
def serve(app: Any) -> Iterator[Served]:
    """Serve ``app`` on 127.0.0.1 (a free port) from a thread; stopped on exit,
    its lifespan's shutdown included."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    config = uvicorn.Config(app, log_level="warning", lifespan="on", timeout_graceful_shutdown=5)
    server = uvicorn.Server(config)
    loop = asyncio.new_event_loop()
    failure: list[BaseException] = []

    def run() -> None:
        asyncio.set_event_loop(loop)
        try:
            loop.run_until_complete(server.serve(sockets=[sock]))
        except BaseException as exc:  # reported to the test below
            failure.append(exc)
        finally:
            loop.close()

    thread = threading.Thread(target=run, name="uvicorn", daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        if failure or not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError(f"the test server did not start: {failure}")
        time.sleep(0.02)
    try:
        yield Served(f"http://127.0.0.1:{sock.getsockname()[1]}", loop)
    finally:
        server.should_exit = True
        thread.join(15)
        sock.close()
        assert not thread.is_alive(), "the test server did not stop"


def screenshot(page: Any, name: str, *, full_page: bool = True) -> Path:
    """Save the page as test-artifacts/screenshots/NAME.png (for a reviewer)."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=full_page)
    return path


def safe_name(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", text).strip("-")[:120]


@contextlib.contextmanager
def chromium() -> Iterator[Any]:
    """Playwright's Chromium: Debian's, launched headless with the CI's flags."""
    if not CHROMIUM.exists():
        pytest.skip(f"{CHROMIUM} is missing (apt-get install chromium; .ci/run does)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True, timeout=60_000
        )
        try:
            yield browser
        finally:
            browser.close()


# -- real worker processes -----------------------------------------------------

WORKER_APP = "tests.browser.worker_app:app"


class Workers:
    """`leaseq worker` processes on the test's schema; all killed on close."""

    def __init__(self, database_url: str, schema: str) -> None:
        self.database_url = database_url
        self.schema = schema
        self.folder = Path(tempfile.mkdtemp(prefix="leaseq-browser-workers-"))
        self.started: list[tuple[subprocess.Popen[str], Path]] = []

    def start(self, *arguments: str) -> subprocess.Popen[str]:
        log = self.folder / f"{len(self.started)}.log"
        with log.open("w") as output:
            process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "leaseq",
                    "worker",
                    WORKER_APP,
                    "--schema",
                    self.schema,
                    "--poll-interval",
                    "0.2",
                    *arguments,
                ],
                cwd=ROOT,
                env={
                    **os.environ,
                    "DATABASE_URL": self.database_url,
                    "LEASEQ_SCHEMA": self.schema,
                },
                stdout=output,
                stderr=subprocess.STDOUT,
                text=True,
            )
        self.started.append((process, log))

        def started() -> bool:
            return "worker started" in log.read_text(errors="replace") or process.poll() is not None

        wait_for(
            started,
            timeout=60,
            what="the worker process starting",
        )
        assert process.poll() is None, self.output(process)
        return process

    def output(self, process: subprocess.Popen[str]) -> str:
        for started, log in self.started:
            if started is process:
                return log.read_text(errors="replace")
        return ""

    def stop(self, process: subprocess.Popen[str], timeout: float = 20.0) -> int:
        """SIGTERM, then wait (the worker finishes or releases what it runs)."""
        process.send_signal(signal.SIGTERM)
        return process.wait(timeout)

    def close(self) -> None:
        for process, _ in self.started:
            if process.poll() is None:
                process.kill()
            process.wait(10)
        shutil.rmtree(self.folder, ignore_errors=True)
