"""Grouped jobs that come due all the time (tenants' scheduled sends, retries
spread by their backoff's jitter) never stop the claims of their queue: each
claim starts ready jobs, whatever came due while it ran."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from .clients import Client
from .conftest import Clock

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


def test_a_tenants_huge_burst_coming_due_holds_up_no_other_tenants_ready_job(
    client: Client, clock: Clock
) -> None:
    """One tenant's 12,000 jobs come due at once (a nightly batch, retries after an
    outage) beside another tenant's job that is ready: the first claim() starts the
    latter. A claim makes due jobs ready 1,000 at a time and, once it had made its
    most, took no job at all: claim() came back empty (eleven statements), and the
    other tenants waited until the whole burst had been made ready."""
    client.enqueue_many("mail", [{}] * 12_000, group="big", delay=60)
    clock.advance(61)
    small = client.enqueue("mail", {}, group="small")
    claims = client.claim("mail", limit=10)
    assert small in {c.job_id for c in claims}, [c.group for c in claims]


def test_a_due_job_not_yet_made_ready_keeps_its_priority_in_its_group(
    client: Client, clock: Clock
) -> None:
    """The claim makes due jobs ready oldest first, 1,000 at most: a job of the group
    due later but of a higher priority may still wait to be made ready, and no job of
    a lower priority of its group starts ahead of it."""
    client.enqueue_many("mail", [{}] * 1_000, group="a", delay=60)
    # Due just after the thousand, which are made ready first.
    high = client.enqueue("mail", {"p": "high"}, group="a", priority=9, delay=61)
    clock.advance(62)
    middle = client.enqueue("mail", {"p": "middle"}, group="a", priority=5)
    first = client.claim("mail", limit=1)
    assert [c.job_id for c in first] == [high], [c.priority for c in first]
    assert middle not in {c.job_id for c in first}
