"""The rate windows of groups (rate_limit_per_group) are dropped by the reaper's
round once no start is left in them, never while one still counts."""

from __future__ import annotations

from typing import Any

import leaseq

from .conftest import Clock


def _sql(queue: leaseq.Queue, sql: str, params: Any = None) -> list[tuple[Any, ...]]:
    with queue.connection() as conn:
        cursor = conn.execute(sql.replace("{schema}", f'"{queue.schema}"'), params)
        return list(cursor.fetchall()) if cursor.description else []


def test_the_rate_windows_of_groups_long_gone_do_not_stay_for_ever(
    queue: leaseq.Queue, clock: Clock
) -> None:
    """Each group that ever started a job under ``rate_limit_per_group`` got a row
    of bookkeeping (its window) that nothing removed: with a group per tenant or
    per user, the table grew by one row per group ever seen, after retention had
    removed every job of theirs and their windows had long passed."""
    queue.configure_queue("mail", rate_limit_per_group=(5, 1))
    queue.enqueue_many("mail", [{"n": n} for n in range(3)], group="busy")
    for n in range(20):
        queue.enqueue("mail", {"n": n}, group=f"tenant-{n}")
    claims = queue.claim("mail", limit=30, lease=600)
    assert len(claims) == 23
    queue.complete_many(claims)
    assert _sql(queue, "SELECT count(*) FROM {schema}.group_rate") == [(21,)]
    clock.advance(30)  # every window has passed
    queue.enqueue("mail", {}, group="busy")
    (claim,) = queue.claim("mail", limit=5)  # busy starts again: its window is live
    queue.reap()  # what the maintenance leader runs every round
    queue.prune(older_than=0)
    assert _sql(queue, "SELECT group_key FROM {schema}.group_rate") == [("busy",)]
    queue.complete(claim)
    # And a window still counts after a round: busy may start 4 more now, not 5.
    queue.enqueue_many("mail", [{}] * 6, group="busy")
    assert len(queue.claim("mail", limit=10)) == 4
