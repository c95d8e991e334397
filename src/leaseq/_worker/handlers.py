"""Running one handler under its timeout (the job's own, else its task's): on the
event loop, or in a daemon thread. Both return what the handler returned.

Only the worker's own deadline is a timeout: a ``TimeoutError`` the handler
raises itself (``socket.timeout`` from a read, an ``asyncio.timeout`` of its own)
propagates like any other error and goes through the task's ErrorPolicy.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from .._waiting import cancelling
from .context import JobContext
from .threads import DaemonThreads


class TimedOut(Exception):
    """The job's timeout passed (never a TimeoutError the handler raised itself)."""


async def run_on_loop(
    call: Callable[[], Awaitable[Any]], timeout: float | None, timed_out: Callable[[], None]
) -> Any:
    """Await ``call()`` (the handler, or the handler inside the app's hooks)."""
    if timeout is None:
        return await call()
    return await run_until(call(), asyncio.get_running_loop().time() + timeout, timed_out)


async def run_until(
    awaitable: Awaitable[Any], deadline: float | None, timed_out: Callable[[], None]
) -> Any:
    """Await ``awaitable`` until ``deadline`` (the loop's time; None: no limit):
    past it, tell the attempt (``timed_out``) and raise TimedOut."""
    if deadline is None:
        return await awaitable
    loop = asyncio.get_running_loop()
    told = False

    def tell() -> None:
        nonlocal told
        if not told:
            told = True
            timed_out()

    # The attempt is told (job.lost) when its deadline passes, not once its
    # handler has ended: an async handler that swallows the cancellation must
    # find job.lost set and its job.atransaction() refused, as a sync one does.
    # (Run in the same turn of the loop as the scope's cancellation, before the
    # handler can see it.)
    telling = loop.call_at(deadline, tell)
    scope = asyncio.timeout_at(deadline)
    try:
        async with scope:
            returned = await awaitable
    except TimedOut:
        raise  # (a thread's, inside: told already)
    except BaseException as error:
        if isinstance(error, asyncio.CancelledError) and cancelling():
            raise  # the worker's own cancellation (a stop, a lost lease): not a timeout
        if not (scope.expired() or loop.time() >= deadline):
            raise  # the handler's own, in time (its own TimeoutError included)
        # Its deadline's cancellation, or what the handler turned it into (a
        # ValueError raised from an ``except CancelledError``), or an error it
        # raised once it had blocked the loop past its deadline: out of time all
        # the same. Taken as its own error, one its task fails on failed the job
        # for good where a timeout retries it (as for a sync handler's thread,
        # what a timed-out handler ends with is not its outcome).
        tell()
        raise TimedOut from None
    finally:
        telling.cancel()
    if scope.expired() or loop.time() >= deadline:
        # The handler caught the cancellation its deadline sent and returned; or
        # it blocked the event loop past its deadline (a time.sleep, a blocking
        # client), so that the cancellation never came: it still ran out of time,
        # and what it ended with is not its outcome (as for a sync handler that
        # returns after its timeout).
        tell()
        raise TimedOut
    return returned


async def run_in_thread(
    threads: DaemonThreads,
    function: Callable[[JobContext], Any],
    context: JobContext,
    timeout: float | None,
    timed_out: Callable[[], None],
) -> Any:
    """Run ``function(context)`` (the handler, or the handler inside the app's
    hooks) in a daemon thread and wait for it; past the timeout, tell it
    (``timed_out``) and keep waiting.

    The thread cannot be stopped, so the attempt (its slot, its lease) lasts until
    it returns: nobody else can start the job meanwhile. Then TimedOut is raised.
    """
    thread = threads.submit(function, context)
    try:
        done, _ = await asyncio.wait((thread,), timeout=timeout)
        if not done:
            timed_out()
            await asyncio.wait((thread,))
            _ignore_result(thread)  # what a timed-out handler ends with is not its outcome
            raise TimedOut
    except asyncio.CancelledError:
        # Released at shutdown while the thread runs on: whatever it ends with,
        # it is no longer this worker's to report.
        thread.add_done_callback(_ignore_result)
        raise
    return thread.result()  # the handler's own outcome, its own TimeoutError included


def _ignore_result(future: asyncio.Future[object]) -> None:
    if not future.cancelled():
        future.exception()  # retrieved: no "exception was never retrieved" at exit
