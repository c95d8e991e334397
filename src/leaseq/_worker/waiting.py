"""Waiting for an event or a timeout, whichever comes first, cancellably.

``asyncio.wait_for`` on Python 3.11 can turn a cancellation that arrives while
its timeout fires into a TimeoutError; a loop that takes a TimeoutError for "no
event, go on" would then never see its own cancellation and never end (the
worker's stop waited forever on its heartbeat, tests/test_worker_robustness.py).
``asyncio.wait`` never swallows the caller's cancellation. And a cancellation
that something below swallowed all the same (a driver that turns an interrupted
query into a result) still ends the loop: a task whose cancellation is pending
raises it at its next wait.
"""

from __future__ import annotations

import asyncio


async def wait_for_event(event: asyncio.Event, timeout: float | None) -> None:
    """Return once ``event`` is set or ``timeout`` seconds passed (None: no limit),
    clearing it; a cancellation of the caller always propagates."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError
    waiter = asyncio.ensure_future(event.wait())
    try:
        await asyncio.wait({waiter}, timeout=None if timeout is None else max(timeout, 0.0))
    finally:
        waiter.cancel()
    event.clear()
