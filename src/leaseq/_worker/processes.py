"""Handlers of ``@app.task(..., executor="process")``: each call in a child process.

CPU-bound Python holds the GIL: in a thread it slows every other job and the
worker's own loop (its renewals, its claims). In a child process it runs on a
core of its own. The worker's side is unchanged: the attempt's daemon thread
(:mod:`.threads`) calls :meth:`ProcessPool.call`, which hands the claim to an
idle child and waits for its answer, so the slot, the lease and its renewals,
the timeout, the hooks and the acknowledgement are the same as for a thread.

* Children are started with ``spawn`` (never ``fork``: the worker has threads
  and open connections), when first needed, up to one per slot, and reused.
  Each imports the handler by its module and name: a process handler must be a
  module-level function.
* In the child the handler gets a :class:`JobContext` of its own: the same
  claim, ``job.transaction()`` (its effect and the fenced completion in one
  transaction, on the child's own connection), and ``job.lost``, a
  ``threading.Event`` set from a flag the worker raises when the attempt is lost
  (lease lost, timeout, shutdown).
* Children ignore SIGINT and SIGTERM (sent to the whole process group by a
  terminal's Ctrl-C or a service manager): the worker stops them itself, after
  its grace. An idle child found dead is replaced before it is handed a job.
* A child whose worker is gone (killed outright: nothing could stop its
  children) tells its handler (``job.lost``) and leaves ``KILL_AFTER`` seconds
  later, rather than run on beside the job's next attempt.
* A child that does not return within ``KILL_AFTER`` seconds of being told is
  killed and replaced: unlike a thread, a process can be stopped. Its open
  transaction dies with its connection (rolled back). A child that dies on its
  own (a crash, the OOM killer) fails the attempt with
  :class:`ProcessHandlerDied`, a retryable error; the worker goes on.
* Each child leads a process group of its own, which the processes its handler
  starts join: a child killed, or dead under its handler, is ended with them
  (they would run on beside the job's next attempt). A handler that returns
  leaves what it started alone.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing import resource_tracker
from multiprocessing.connection import Connection as Pipe
from multiprocessing.context import SpawnProcess
from typing import Any

from .. import _tracing
from .._logs import get_logger, job_fields
from .context import JobContext
from .process_child import KILL_AFTER, POLL, STOP_SIGNALS, Flag, Packed, child_main, unpacked

log = get_logger("leaseq.worker")

#: Why a child whose job.transaction() completed its job is still told, then
#: killed: its timeout, and the worker's stop (``mark_lost``'s reasons).
_ENDS_EVEN_A_COMPLETED_ONE = frozenset({"timed out", "worker shutting down"})


class ProcessHandlerDied(Exception):
    """The handler's process ended without an answer (a crash, a kill from outside)."""


class ProcessHandlerKilled(Exception):
    """The handler's process was killed: it had not stopped after being told to."""


@dataclass
class _Child:
    process: SpawnProcess
    pipe: Pipe
    lost: Flag  # raised by the worker: the attempt is lost
    completed: Flag  # raised by the child: its job.transaction() committed the completion
    leads_group: Flag  # raised by the child: it leads a process group of its own

    def kill(self) -> None:
        """Kill the child, and the processes its handler started (its process
        group, which they joined), rather than leave them orphaned beside the
        job's next attempt. A child that died on its own is reaped already: its
        pid still names its group while a process of the group runs (the kernel
        gives out no pid that a group still uses), else nothing is found."""
        pid = self.process.pid
        if pid and self.leads_group.value:  # (0 would be the worker's own group)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)
        self.process.kill()


class ProcessPool:
    """Up to ``size`` spawned children, each running one handler call at a time."""

    def __init__(self, size: int, dsn: str, schema: str) -> None:
        self._size = size
        self._dsn = dsn
        self._schema = schema
        self._context = multiprocessing.get_context("spawn")
        self._idle: list[_Child] = []
        self._children: list[_Child] = []
        self._lock = threading.Lock()
        self._closed = False

    def call(self, handler: Callable[[JobContext], Any], context: JobContext) -> Any:
        """Run ``handler(context)`` in a child; blocks the calling (daemon) thread."""
        # The attempt's span (current in this thread) goes with the work: the
        # handler's own spans in the child nest under it, as in a thread.
        work = (
            handler.__module__,
            handler.__qualname__,
            context.claim,
            _tracing.current(),
            context.max_result_bytes,
        )
        child = self._hand_over(work)
        reusable = False
        try:
            answer = self._wait(child, context)
            reusable = True
        finally:
            self._give_back(child, reusable)
        kind, value, completed, result = answer
        if completed:  # its job.transaction() committed the completion, with ``result``
            context._completed_with(result)
        if kind == "error":
            raise value
        return value

    def close(self) -> None:
        """Stop every child: idle ones are asked to leave, busy ones killed.

        A busy child's pipe is its call's, not the pool's to use or close: that
        call's thread waits on it, and hands the child back (closing the pipe)
        once the child answered (killed then: the pool is closed) or died.
        Closed from both threads, a pipe's descriptor could be closed twice, the
        second time under whatever the process had opened meanwhile with that
        number (a database connection's socket).
        """
        with self._lock:
            self._closed = True
            children, idle = self._children, self._idle
            self._children, self._idle = [], []
        for child in idle:
            with contextlib.suppress(OSError, ValueError):
                child.pipe.send(None)
        deadline = time.monotonic() + 2.0
        for child in children:
            child.process.join(max(deadline - time.monotonic(), 0.0))
            if child.process.is_alive():
                child.kill()
                child.process.join(1.0)
            if child in idle:
                child.pipe.close()

    def _hand_over(self, work: tuple[str, str, Any, Any, int]) -> _Child:
        """A child that took ``work``: an idle one, else a new one.

        An idle child may have died since its last call (killed from outside, the
        OOM killer): it is replaced, and the job never counts an attempt for it.
        """
        while True:
            child, new = self._acquire()
            child.lost.value = 0
            child.completed.value = 0
            try:
                child.pipe.send(work)
            except OSError:  # its end of the pipe is gone: it died while idle
                self._give_back(child, reusable=False)
                if new:
                    raise ProcessHandlerDied(_ended(child)) from None
                continue
            return child

    def _acquire(self) -> tuple[_Child, bool]:
        """An idle child that is still alive, else a new one (and True)."""
        dead: list[_Child] = []
        try:
            with self._lock:
                if self._closed:
                    raise ProcessHandlerDied("the worker is stopping")
                while self._idle:
                    child = self._idle.pop()
                    if child.process.is_alive():
                        return child, False
                    dead.append(child)
        finally:
            for child in dead:
                self._give_back(child, reusable=False)
        # At most one call per slot is in flight, and the pool has a child per
        # slot: a new child is always within the size.
        child = self._spawn()
        with self._lock:
            self._children.append(child)
        return child, True

    def _give_back(self, child: _Child, reusable: bool) -> None:
        with self._lock:
            if reusable and not self._closed and child.process.is_alive():
                self._idle.append(child)
                return
            if child in self._children:
                self._children.remove(child)
        if reusable:  # its handler returned (the pool closed since): what it started stays
            child.process.kill()
        else:
            child.kill()
        child.process.join(1.0)
        child.pipe.close()

    def _spawn(self) -> _Child:
        ours, theirs = self._context.Pipe()
        lost = self._context.Value("b", 0, lock=False)
        completed = self._context.Value("b", 0, lock=False)
        leads_group = self._context.Value("b", 0, lock=False)
        process = self._context.Process(
            target=child_main,
            args=(theirs, lost, completed, leads_group),
            kwargs={"dsn": self._dsn, "schema": self._schema},
            name="leaseq-process-handler",
            daemon=True,
        )
        # The group's stop signals are held back from the child until it ignores
        # them (child_main): the mask goes with it through spawn's exec, and its
        # start-up (a new interpreter, the imports) takes a good part of a second,
        # in which a Ctrl-C or a service manager's stop killed it. Held back here
        # in this thread only, for the spawn: not lost, delivered right after.
        # The start of multiprocessing's resource tracker, at a process's first
        # spawn, unblocks SIGINT and SIGTERM (bpo-33613's own mask, undone with
        # SIG_UNBLOCK): started first, it cannot undo this one.
        resource_tracker.ensure_running()
        held = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
        try:
            process.start()
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, held)
        theirs.close()
        return _Child(process, ours, lost, completed, leads_group)

    def _wait(self, child: _Child, context: JobContext) -> tuple[str, Any, bool, Any]:
        """The child's answer; tells it when the attempt is lost, kills it if it stays."""
        told_at: float | None = None
        while True:
            if child.pipe.poll(POLL):
                try:
                    packed: Packed = child.pipe.recv()
                except (EOFError, OSError):
                    return _died(child, context)
                return unpacked(packed)
            if not child.process.is_alive():
                return _died(child, context)
            if child.completed.value and not context.completed:
                # Its job.transaction() committed: the job is done, whatever the
                # handler does next. The worker stops renewing its lease now (a
                # renewal of a done job is refused, and read as a lost lease that
                # would get this child told, then killed) and waits for its answer.
                context.mark_completed()
            if context.lost.is_set() and (
                not context.completed or context.lost_reason in _ENDS_EVEN_A_COMPLETED_ONE
            ):
                # (A done job's lease is not the child's to lose, but its time is:
                # a child that hangs past its timeout must not keep its slot.)
                if told_at is None:
                    child.lost.value = 1
                    told_at = time.monotonic()
                elif time.monotonic() - told_at > KILL_AFTER:
                    child.kill()
                    raise ProcessHandlerKilled(
                        f"job {context.job_id}: its process had not stopped {KILL_AFTER:g}s "
                        f"after being told ({context.lost_reason}); killed"
                    )


def _died(child: _Child, context: JobContext) -> tuple[str, Any, bool, Any]:
    """A child that ended without an answer: ProcessHandlerDied, a retryable
    error; but if its job.transaction() had committed the completion, the job
    is done (its answer, and job.result, went with it)."""
    if not child.completed.value:
        raise ProcessHandlerDied(_ended(child))
    result = None
    with contextlib.suppress(Exception):  # the result its completion stored, for the hooks
        result = context._sync.result(context.job_id)
    log.warning(
        "job %d: its handler's process ended after its job.transaction() committed "
        "the completion (%s): the job is done",
        context.job_id,
        _ended(child),
        extra=job_fields(context.claim),
    )
    return ("ok", None, True, result)


def _ended(child: _Child) -> str:
    child.process.join(1.0)
    return f"the handler's process ended without an answer (exit code {child.process.exitcode})"
