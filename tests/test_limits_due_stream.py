"""Grouped jobs that come due all the time (tenants' scheduled sends, retries
spread by their backoff's jitter) never stop the claims of their queue: each
claim starts ready jobs, whatever came due while it ran."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from .clients import Client

#: Jobs, groups, and the seconds over which they come due: two a millisecond,
#: so that every claim statement finds some that came due since the last one.
JOBS = 4_000
GROUPS = 40
SPREAD = 2.0


def _sql(client: Client, sql: str, params: Any = None) -> list[tuple[Any, ...]]:
    with client.connection() as conn:
        cursor = conn.execute(sql.replace("{schema}", f'"{client.schema}"'), params)
        return list(cursor.fetchall()) if cursor.description else []


def test_jobs_coming_due_all_the_time_never_stop_the_claims(client: Client) -> None:
    """A claim that makes ready the grouped jobs it finds due (they waited,
    `deferred`) cannot take those in its own statement; it took no job at all,
    the queue's ready ones included, and claimed again (10 times at most).
    With jobs coming due at every moment every claim made some ready: nearly
    every claim() came back empty while jobs were ready, and the queue stalled."""
    per_group = JOBS // GROUPS
    for group in range(GROUPS):
        client.enqueue_many("mail", [{}] * per_group, group=f"tenant-{group}", delay=600)
    # Each job due at its own moment, one after the other (in id order) from
    # half a second on: the row trigger keeps them deferred, as a delay does.
    _sql(
        client,
        "UPDATE {schema}.job SET available_at = {schema}.clock()"
        " + make_interval(secs => 0.5 + %s * (job_id - (SELECT min(job_id) FROM {schema}.job))"
        " / %s::float8)",
        (SPREAD, JOBS),
    )
    ((last_due,),) = _sql(client, "SELECT max(available_at) FROM {schema}.job")
    empty: list[tuple[datetime, int]] = []
    claimed = 0
    while True:
        # Jobs due and not started: the claim below, later, finds them due too.
        ((now, ready),) = _sql(
            client,
            "SELECT {schema}.clock(), count(*) FROM {schema}.job"
            " WHERE status = 'queued' AND available_at <= {schema}.clock()",
        )
        if now > last_due:
            break
        claims = client.claim("mail", limit=5)
        assert not claims.held_back  # no limit: only the groups' turns
        if ready and not claims:
            empty.append((now, ready))
        if claims:
            client.complete_many(claims)
            claimed += len(claims)
    assert empty == [], f"{len(empty)} claims started nothing while jobs were ready"
    assert claimed, "the stream ended before the first claim"
