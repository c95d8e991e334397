"""LISTEN for enqueue notifications: a wake-up hint, re-established after every loss.

The schema's channel carries queue names (something was enqueued there) and
"!lost <job_id>" (an operator cancelled a running job: its lease may be gone;
"!" never starts a queue name). Both are hints: polling and the heartbeat find
out the same, only later, when a notification is lost.
"""

from __future__ import annotations

from collections.abc import Callable

from .._async_client import AsyncQueue
from .._errors import InvalidDatabaseURL, TransientError
from .._logs import get_logger
from .._waiting import pause
from .outage import Outage
from .state import WorkerStats

log = get_logger("leaseq.worker")

#: The notification of a job whose claim an operator ended (cancel.sql sends it).
LOST_PREFIX = "!lost "

#: A bigint's largest value: no job id is beyond it.
_MAX_JOB_ID = 2**63 - 1


async def listen_for_work(
    listener: AsyncQueue,
    queues: set[str],
    *,
    work: Callable[[str | None], None],
    lost: Callable[[int], None],
    stats: WorkerStats,
    outage: Outage | None = None,
) -> None:
    """Call ``work(queue)`` for every notification about one of ``queues``; never
    returns.

    Polling runs behind this regardless, so a lost connection delays nothing by
    more than a poll interval; after each reconnect ``work(None)`` says that any
    queue may have work (what was enqueued meanwhile is unknown).
    """
    outage = outage or Outage()
    delay = 0.1
    while True:
        try:
            async for payload in listener._listen():
                delay = 0.1
                if payload == "":  # (re)connected
                    outage.answered()
                    work(None)
                elif payload in queues:
                    work(payload)
                elif payload.startswith(LOST_PREFIX):
                    job_id = _job_id(payload[len(LOST_PREFIX) :])
                    if job_id is not None:
                        lost(job_id)
        except InvalidDatabaseURL:
            raise  # a setup error: no reconnection can connect with it
        except TransientError as exc:
            outage.failed("LISTEN", exc)
        stats.listen_reconnects += 1
        await pause(delay)
        delay = min(delay * 2, 5.0)


def _job_id(text: str) -> int | None:
    """The job id ``text`` names, or None. Any role that may connect may NOTIFY
    on the channel: what is not a job id (a digit int() refuses, like a
    superscript; more digits than it reads; past bigint) is ignored, never
    raised (that stopped the worker)."""
    if not (0 < len(text) <= 19 and text.isascii() and text.isdigit()):
        return None
    job_id = int(text)
    return job_id if job_id <= _MAX_JOB_ID else None
