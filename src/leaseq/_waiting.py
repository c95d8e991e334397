"""Waiting cancellably: for an event or a timeout, or a pause in a service's loop.

``asyncio.wait_for`` on Python 3.11 can turn a cancellation that arrives while
its timeout fires into a TimeoutError; a loop that takes a TimeoutError for "no
event, go on" would then never see its own cancellation and never end (the
worker's stop waited forever on its heartbeat, tests/test_worker_robustness.py).
``asyncio.timeout`` counts cancellations (``Task.uncancel``): it raises
TimeoutError only for its own, and the caller's always propagates. And a
cancellation that something below swallowed all the same (a driver that turns
an interrupted query into a result) still ends the loop: a task whose
cancellation is pending raises it at its next wait.

The event is awaited in the caller's own task, not in a task of its own: a set
event resumes the waiter at the loop's next turn (the claim loop is then the
first to run after a handler returns, ahead of the acknowledgement's flush).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

#: How long an operation cancelled by :func:`within` may take to end before it
#: is cancelled again.
AGAIN_AFTER = 0.2


def cancelling() -> bool:
    """Whether the running task itself was asked to cancel (a CancelledError may
    also come from something it awaited: a handler's own, a task it awaited)."""
    try:
        task = asyncio.current_task()
    except RuntimeError:  # no running loop: a sync caller
        return False
    return task is not None and task.cancelling() > 0


def raise_if_cancelling(cause: BaseException | None = None) -> None:
    """Raise the current task's pending cancellation, if it has one that something
    below swallowed: Python 3.11's ``asyncio.wait_for`` (psycopg_pool waits for a
    pool's first connections with it) returns its result when that arrives as the
    cancellation does, and a driver can turn an interrupted query into a
    connection error. A worker stopped right after it started waited forever on
    its scheduler this way (tests/test_worker_robustness.py)."""
    if cancelling():
        raise asyncio.CancelledError from cause


async def pause(seconds: float) -> None:
    """``asyncio.sleep``, for the loops of services that run until cancelled: a
    cancellation swallowed below ends the loop here at the latest."""
    raise_if_cancelling()
    await asyncio.sleep(seconds)


async def wait_for_event(event: asyncio.Event, timeout: float | None) -> None:
    """Return once ``event`` is set or ``timeout`` seconds passed (None: no limit),
    clearing it; a cancellation of the caller always propagates."""
    raise_if_cancelling()
    if not event.is_set():
        if timeout is None:
            await event.wait()
        else:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(max(timeout, 0.0)):
                    await event.wait()
    event.clear()


async def within(operation: Coroutine[Any, Any, T], seconds: float) -> T:
    """``operation``'s result if it comes within ``seconds``; else it is cancelled,
    and TimeoutError raised once it has ended. One still running AGAIN_AFTER
    after its cancellation is cancelled again: psycopg answers a first
    cancellation by asking the server to cancel the query and then waiting for
    it to end (10 s at most, with a dead connection), a second by closing the
    connection. A cancellation of the caller cancels the operation too."""
    task = asyncio.ensure_future(operation)
    try:
        done, _ = await asyncio.wait({task}, timeout=max(seconds, 0.0))
        if done:
            return task.result()
        task.cancel()
        done, _ = await asyncio.wait({task}, timeout=AGAIN_AFTER)
        if not done:
            task.cancel()
            await asyncio.wait({task})
    except asyncio.CancelledError:
        task.cancel()
        raise
    if not task.cancelled():
        task.exception()  # (retrieved: it may have failed as it was cancelled)
    raise TimeoutError(f"no answer within {seconds:.1f}s")
