"""``leaseq worker --processes N``'s supervisor: stop signals reach every child."""

from __future__ import annotations

import multiprocessing
import signal
import time
from collections.abc import Callable
from typing import Any

from leaseq._worker.supervisor import Supervisor

_SPAWN = multiprocessing.get_context("spawn")

#: Called once a child has been started (in the test process only; never pickled).
_after_start: list[Callable[[], None]] = []


def _child(slot: int) -> None:
    """Runs until told to stop (like a worker), then exits cleanly."""
    stop = False

    def on_stop(signum: int, frame: Any) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_stop)
    deadline = time.monotonic() + 120
    while not stop and time.monotonic() < deadline:
        time.sleep(0.02)


class _Process(_SPAWN.Process):  # type: ignore[misc,name-defined]
    """A spawned child whose start() is followed by the test's hook, as a signal
    arriving at that moment would run the supervisor's handler."""

    def start(self) -> None:
        super().start()
        while _after_start:
            _after_start.pop()()


class _Context:
    Process = _Process


def test_a_stop_signal_during_a_childs_start_reaches_that_child() -> None:
    """The stop signal arrives while a child is being started (as when the
    supervisor restarts a crashed one). Without care, that child never hears it:
    it runs on until the supervisor's shutdown timeout and is then killed."""
    supervisor = Supervisor(1, _child, (), shutdown_timeout=20.0)
    supervisor._context = _Context()  # type: ignore[assignment]
    _after_start.append(lambda: supervisor._on_signal(signal.SIGTERM, None))
    assert supervisor.run() == 0
    assert not _after_start  # the signal came during the start
    (child,) = supervisor._children.values()
    # Stopped by the forwarded SIGTERM (cleanly, or before its handler was set),
    # never by the supervisor's SIGKILL at the timeout.
    assert child.exitcode in (0, -signal.SIGTERM), child.exitcode
