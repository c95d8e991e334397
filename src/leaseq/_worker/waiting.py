"""Waiting for an event or a timeout, whichever comes first, cancellably.

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


async def wait_for_event(event: asyncio.Event, timeout: float | None) -> None:
    """Return once ``event`` is set or ``timeout`` seconds passed (None: no limit),
    clearing it; a cancellation of the caller always propagates."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError
    if not event.is_set():
        if timeout is None:
            await event.wait()
        else:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(max(timeout, 0.0)):
                    await event.wait()
    event.clear()
