"""``leaseq worker --processes N``: N worker processes, restarted when they crash.

Children are started with the ``spawn`` method (no inherited connections or
threads). SIGTERM/SIGINT are forwarded to them so each stops gracefully; a
second signal kills them. A child that exits on its own is restarted after a
backoff that grows while it keeps crashing (under ``--burst`` one that exits
with 0 is done). The supervisor exits 0 once every child stopped cleanly, 1 if
one did not (a second signal, the shutdown timeout: their jobs left to their
leases). A child runs ``target(*args, slot)``:
its slot (0..N-1) stays the same across restarts (its metrics port is PORT+slot).
A child that exits with SETUP_FAILED (its schema is not migrated, or its database
URL cannot be parsed: restarting it would fail the same way, for ever) stops the
others, and the supervisor returns that code.

A signal sent to the whole process group (Ctrl-C, systemd) reaches each child
twice, directly and forwarded; children take the repeat as an echo of the same
signal (see :mod:`leaseq._worker.signals`), so the group's SIGTERM stops them
gracefully, exactly like a SIGTERM to the supervisor alone.

A supervisor killed outright (SIGKILL, the OOM killer) can neither stop nor
restart its children: each child then stops itself, as on a SIGTERM (its jobs
finished within the grace, or given back), rather than run on unsupervised, out
of reach of the next supervisor's stop and beside its new children. It notices
through spawn's pipe (:mod:`.orphans`), even when the supervisor died while the
child was still starting.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import time
from collections.abc import Callable
from multiprocessing.process import BaseProcess
from types import FrameType
from typing import Any

from .._logs import get_logger
from .orphans import when_parent_gone
from .signals import StopSignals, treat_repeats_as_echoes

log = get_logger("leaseq.supervisor")


class Supervisor:
    def __init__(
        self,
        processes: int,
        target: Callable[..., None],
        args: tuple[Any, ...],
        *,
        shutdown_timeout: float = 60.0,
        done_on_clean_exit: bool = False,
    ) -> None:
        self.processes = processes
        #: A child that exits with 0 is done, not restarted (``--burst``); the
        #: supervisor returns once every child is done.
        self.done_on_clean_exit = done_on_clean_exit
        self.target = target
        self.args = args
        self.shutdown_timeout = shutdown_timeout
        self.restarts = 0
        self._context = multiprocessing.get_context("spawn")
        self._children: dict[int, BaseProcess] = {}
        self._failures: dict[int, int] = {}
        self._started_at: dict[int, float] = {}
        self._stopping = False
        self._signals = 0
        self._signum: int = signal.SIGTERM  # the stop signal received, forwarded as it came

    def _start(self, slot: int) -> None:
        child = self._context.Process(
            target=_supervised_child,
            args=(self.target, (*self.args, slot)),
            name=f"leaseq-worker-{slot}",
        )
        child.start()
        self._children[slot] = child
        self._started_at[slot] = time.monotonic()
        log.info("started worker %d (pid %s)", slot, child.pid)
        if self._stopping:
            # The stop signal came while this child was being started (a restart
            # after a crash): the handler forwarded it to the children it knew,
            # not to this one, which would then run until the shutdown timeout.
            self._forward_stop(child)

    def _backoff(self, slot: int, child: BaseProcess) -> float:
        """Restart at once after a long run; back off while a child keeps crashing."""
        ran = time.monotonic() - self._started_at[slot]
        failures = 1 if ran > 60 else self._failures.get(slot, 0) + 1
        self._failures[slot] = failures
        delay: float = min(0.5 * 2.0 ** (failures - 1), 30.0)
        log.warning(
            "worker %d (pid %s) exited with %s; restarting in %.1fs",
            slot,
            child.pid,
            child.exitcode,
            delay,
        )
        return delay

    def _on_signal(self, signum: int, _: FrameType | None) -> None:
        self._signals += 1
        self._signum = signum
        self._stop_all()

    def _stop_all(self) -> None:
        self._stopping = True
        for child in self._children.values():
            self._forward_stop(child)

    def _forward_stop(self, child: BaseProcess) -> None:
        """The stop signal as it came; SIGKILL once a second one came."""
        if child.pid is not None and child.is_alive():
            os.kill(child.pid, signal.SIGKILL if self._signals > 1 else self._signum)

    def run(self) -> int:
        previous = {s: signal.signal(s, self._on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
        try:
            for slot in range(self.processes):
                self._start(slot)
            restart_at: dict[int, float] = {}
            exit_code = 0
            while not self._stopping and self._children:
                time.sleep(0.2)
                for slot, child in list(self._children.items()):
                    if child.is_alive() or self._stopping:
                        continue
                    if self.done_on_clean_exit and child.exitcode == 0:
                        log.info("worker %d (pid %s) is done", slot, child.pid)
                        del self._children[slot]
                        continue
                    if child.exitcode == SETUP_FAILED:
                        log.error("worker %d cannot run as set up; stopping the others", slot)
                        del self._children[slot]
                        self._stop_all()
                        exit_code = SETUP_FAILED
                        continue
                    if slot not in restart_at:
                        restart_at[slot] = time.monotonic() + self._backoff(slot, child)
                    elif time.monotonic() >= restart_at[slot]:
                        del restart_at[slot]
                        self.restarts += 1
                        self._start(slot)
            deadline = time.monotonic() + self.shutdown_timeout
            for child in self._children.values():
                child.join(max(deadline - time.monotonic(), 0))
                if child.is_alive() and child.pid is not None:
                    os.kill(child.pid, signal.SIGKILL)
                    child.join(5)
            # A child that did not stop cleanly (killed by a second signal or at
            # the timeout, its jobs left to their leases) makes the whole stop
            # unclean, as a single worker's exit code says. (One that crashed
            # before the stop and awaited its restart held no job, nor one
            # that the stop signal ended before it had set its handler.)
            unclean = any(
                child.exitcode not in _STOPPED_CLEANLY
                for slot, child in self._children.items()
                if slot not in restart_at
            )
            return exit_code or (1 if unclean else 0)
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)


#: The exit codes of a child that stopped with no job left behind: its own clean
#: exit, or the stop signal itself (arrived before it set its handler: no job yet).
_STOPPED_CLEANLY = frozenset({0, -signal.SIGTERM, -signal.SIGINT})

#: A child's exit code when the worker cannot run as set up (sysexits' EX_CONFIG).
SETUP_FAILED = 78


def _supervised_child(target: Callable[..., None], args: tuple[Any, ...]) -> None:
    """A child's entry point: the group's signal and our forwarded copy are one signal."""
    treat_repeats_as_echoes()
    when_parent_gone(_stop_orphaned, name="leaseq-orphan-watch")
    target(*args)


def _stop_orphaned() -> None:
    """The supervisor is gone: stop as a SIGTERM from it would have, gracefully.
    (Before the worker has set its handler, the signal ends the process at once:
    it holds no job yet.) Not when a stop signal came already: the worker stops
    gracefully then, and a SIGTERM now would be its second signal (leave at once,
    jobs abandoned). Signalled before the line is logged: a log whose reader
    went with the supervisor must not hold the stop up."""
    if StopSignals.any_received:
        log.warning("the supervisor is gone; this worker is stopping already")
        return
    os.kill(os.getpid(), signal.SIGTERM)
    log.warning("the supervisor is gone; stopping this worker")
