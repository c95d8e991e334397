"""The threads sync handlers run in: daemon threads, so a stuck handler cannot pin the process.

``concurrent.futures.ThreadPoolExecutor`` joins its threads when the interpreter
exits, so one handler that never returns (it ignores ``job.lost``) would keep a
stopped worker process alive forever. These threads are daemons: after the
shutdown grace period the process exits and takes them with it.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import queue
import threading
from collections.abc import Callable
from typing import Any, TypeVar

R = TypeVar("R")

_Work = tuple[Callable[[Any], Any], Any, asyncio.AbstractEventLoop, "asyncio.Future[Any]"]


class DaemonThreads:
    """Up to ``size`` daemon threads, started as needed and reused."""

    def __init__(self, size: int, name: str) -> None:
        self._size = size
        self._name = name
        self._work: queue.SimpleQueue[_Work | None] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._idle = threading.Semaphore(0)  # released by a thread each time it is free
        self._lock = threading.Lock()

    def submit(self, function: Callable[[Any], R], argument: Any) -> asyncio.Future[R]:
        """Run ``function(argument)`` in a thread; the future settles on the running loop."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[R] = loop.create_future()
        # The caller's context variables go with the work (as asyncio.to_thread's
        # do): the attempt's tracing span is the current one in its thread.
        context = contextvars.copy_context()

        def in_context(value: Any) -> R:
            return context.run(function, value)

        self._work.put((in_context, argument, loop, future))
        if not self._idle.acquire(blocking=False):
            with self._lock:
                if len(self._threads) < self._size:
                    thread = threading.Thread(
                        target=self._serve, name=f"{self._name}-{len(self._threads)}", daemon=True
                    )
                    thread.start()
                    self._threads.append(thread)
        return future

    def abandoned(self) -> None:
        """A call is no longer waited for (past its time; a thread cannot be
        stopped): its thread stays taken, maybe for ever, so one more may start.
        Else the calls after it would queue behind it, unstarted."""
        with self._lock:
            self._size += 1
            thread = threading.Thread(
                target=self._serve, name=f"{self._name}-{len(self._threads)}", daemon=True
            )
            thread.start()
            self._threads.append(thread)

    def shutdown(self) -> None:
        """Let every thread end once it is free; never waits (a handler may never return)."""
        for _ in self._threads:
            self._work.put(None)

    def _serve(self) -> None:
        while (work := self._work.get()) is not None:
            function, argument, loop, future = work
            result: Any = None
            error: BaseException | None = None
            try:
                result = function(argument)
            except BaseException as exc:  # handed to the awaiting task, as an executor does
                error = exc
            # A closed loop (the worker stopped long ago) has nobody left to tell.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(_settle, future, result, error)
            del work, function, argument, future, result, error
            self._idle.release()


def _settle(future: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
    if future.done():  # nobody waits any more (cancelled)
        return
    if error is not None:
        future.set_exception(_settleable(error))
    else:
        future.set_result(result)


def _settleable(error: BaseException) -> BaseException:
    """What a Future takes: it refuses StopIteration (it would end the awaiting
    coroutine as if it returned), which a handler's stray ``next()`` raises. As a
    coroutine's StopIteration does, it becomes a RuntimeError, the original chained."""
    if not isinstance(error, StopIteration):
        return error
    wrapped = RuntimeError(f"StopIteration: {error}" if str(error) else "StopIteration")
    wrapped.__cause__ = error
    return wrapped
