"""Per-key ordering across a caller's transaction that reads one snapshot
(REPEATABLE READ, SERIALIZABLE): a key moved on there is settled again, never
left stuck behind a job committed while that transaction was open (0019)."""

from __future__ import annotations

from collections.abc import Callable

import psycopg
import pytest

import leaseq

#: A transaction's snapshot held open on purpose: never beside the tests that read
#: plans after VACUUM (see test_plans).
pytestmark = pytest.mark.xdist_group("cleanup_horizon")

Connect = Callable[..., psycopg.Connection[tuple[object, ...]]]


def _claim_ids(queue: leaseq.Queue, limit: int = 10, lease: float = 60) -> list[int]:
    return [c.job_id for c in queue.claim("events", limit=limit, lease=lease)]


@pytest.mark.parametrize("level", ["REPEATABLE_READ", "SERIALIZABLE"])
@pytest.mark.parametrize("write", ["complete", "fail"])
def test_a_key_moved_on_in_a_one_snapshot_transaction_is_not_left_stuck(
    queue: leaseq.Queue, connect: Connect, level: str, write: str
) -> None:
    """A handler writes its effect and the fenced completion in ONE transaction of
    its own (README), here at REPEATABLE READ or SERIALIZABLE (a Django project's
    isolation_level, a database default). A producer commits the key's next job
    while the handler's transaction is open: it waits behind the running job.
    The completion settles the key on the transaction's snapshot, which does not
    hold that job: nothing made it the key's head, and no repair note was left
    (no producer was in flight any more), so the key stayed stuck for ever."""
    queue.configure_queue("events", ordering_policy="continue")
    queue.enqueue("events", {}, key="k", seq=1, max_attempts=5)
    (claim,) = queue.claim("events")
    conn = connect()
    conn.isolation_level = getattr(psycopg.IsolationLevel, level)
    conn.execute("SELECT 1")  # the handler's own business read: the snapshot is taken
    second = queue.enqueue("events", {}, key="k", seq=2)  # waits behind the running job
    if write == "complete":
        queue.complete(claim, conn=conn)
    else:
        queue.fail(claim, "broken", conn=conn)  # under continue: the key moves on
    conn.commit()
    assert _claim_ids(queue) == [second]
