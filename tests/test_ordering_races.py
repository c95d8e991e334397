"""Per-key ordering where an operator's or a producer's change races a settler.

The oracle is the contract (DESIGN 1.10): only the earliest unfinished job of a
key is eligible, a failed head follows the queue's policy *as it is now*, and a
key whose head may run is never stuck (some claim takes it, within a bounded
wait for the repair notes that settle a key again).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import psycopg

import leaseq

Connect = Callable[..., psycopg.Connection[tuple[object, ...]]]


def _claim_within(queue: leaseq.Queue, seconds: float) -> list[int]:
    """What claims return within ``seconds``: repair notes are acted on by the
    claims themselves, each settling a key again 200 ms after it could not."""
    deadline = time.monotonic() + seconds
    while True:
        ids = [c.job_id for c in queue.claim("events", limit=10, lease=60)]
        if ids or time.monotonic() > deadline:
            return ids
        time.sleep(0.05)


def _blocked_by(connect: Connect, pid: int, seconds: float = 10) -> bool:
    """Whether some session waits on the one of ``pid`` within ``seconds``."""
    with connect(autocommit=True) as watcher:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            row = watcher.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE %s = ANY(pg_blocking_pids(pid))",
                (pid,),
            ).fetchone()
            if row and row[0]:
                return True
            time.sleep(0.01)
    return False


def test_a_head_failed_while_the_policy_turns_to_continue_does_not_leave_its_key_stuck(
    queue: leaseq.Queue, connect: Connect
) -> None:
    """A handler fails its job in its own transaction (READ COMMITTED) while an
    operator switches the queue from 'block' to 'continue'. The fail settles
    the key under 'block' (the change is not committed yet): the next job
    waits. The change settles the keys with a failed job it sees, and the fail
    is not committed yet. Both commit: the queue says 'continue', the key's
    head failed, and its next job must go on."""
    queue.configure_queue("events", ordering_policy="block")
    queue.enqueue("events", {}, key="k", seq=1)
    second = queue.enqueue("events", {}, key="k", seq=2)
    (claim,) = queue.claim("events")
    handler = connect()
    queue.fail(claim, "broken", conn=handler)  # settled under 'block'
    errors: list[BaseException] = []

    def change() -> None:
        try:
            queue.configure_queue("events", ordering_policy="continue")
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    operator = threading.Thread(target=change)
    operator.start()
    # The change either committed already or waits for the handler's transaction.
    operator.join(2)
    if operator.is_alive():
        assert _blocked_by(connect, handler.info.backend_pid)
    handler.commit()
    operator.join(30)
    assert not operator.is_alive()
    assert not errors, errors
    assert (settings := queue.queue_settings("events")) is not None
    assert settings.ordering_policy == "continue"
    assert _claim_within(queue, 5) == [second], "the key is stuck behind its failed head"
