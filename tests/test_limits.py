"""Concurrency and rate limits, groups and fair share, held by the claim itself:
never more live leases than a queue's (or a group's) limit, never more starts in
a window than its rate, a saturated group never holding up the others, groups
taking turns."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import psycopg
import pytest

from leaseq import Claim, InvalidArgument, InvalidJob
from leaseq._statement import notify_channel

from .clients import Client
from .conftest import Clock
from .windows import most_in_any_window


def _sql(client: Client, sql: str, params: Any = None) -> list[tuple[Any, ...]]:
    with client.connection() as conn:
        cursor = conn.execute(sql.replace("{schema}", f'"{client.schema}"'), params)
        return list(cursor.fetchall()) if cursor.description else []


def _live(client: Client, queue: str) -> int:
    """Running jobs whose lease is live, by the database's clock."""
    ((count,),) = _sql(
        client,
        "SELECT count(*) FROM {schema}.job WHERE queue = %s AND status = 'running'"
        " AND lease_until > {schema}.clock()",
        (queue,),
    )
    return int(count)


# -- max_running ------------------------------------------------------------------


def test_max_running_caps_the_live_claims_and_a_finish_frees_a_slot(client: Client) -> None:
    client.enqueue_many("reports", [{"n": n} for n in range(20)])
    client.configure_queue("reports", max_running=5)
    first = client.claim("reports", limit=10)
    assert len(first) == 5
    assert (first.held_back, first.retry_in) == (True, None)
    again = client.claim("reports", limit=10)
    assert (len(again), again.held_back) == (0, True)
    client.complete_many(first[:2])
    freed = client.claim("reports", limit=10)
    assert len(freed) == 2  # reusable at once
    assert _live(client, "reports") == 5
    # Lifting the limit lets the rest through.
    client.configure_queue("reports", max_running=None)
    rest = client.claim("reports", limit=100)
    assert (len(rest), rest.held_back) == (13, False)


def test_a_claim_within_the_limit_is_not_held_back(client: Client) -> None:
    client.enqueue_many("reports", [{}] * 3)
    client.configure_queue("reports", max_running=10)
    claims = client.claim("reports", limit=3)
    assert (len(claims), claims.held_back) == (3, False)


def test_expired_leases_do_not_count_against_the_limit(client: Client, clock: Clock) -> None:
    """Two claims whose workers died, with no attempt left to recover: once their
    leases expire, their slots are free for the next jobs (pgqueuer #474)."""
    client.enqueue_many("reports", [{}] * 2, max_attempts=1)
    client.enqueue_many("reports", [{}] * 3)
    client.configure_queue("reports", max_running=2)
    dead = client.claim("reports", limit=5, lease=5)
    assert len(dead) == 2
    assert all(c.max_attempts == 1 for c in dead)
    assert len(client.claim("reports", limit=5)) == 0
    clock.advance(6)
    after = client.claim("reports", limit=5)
    assert len(after) == 2
    assert not {c.job_id for c in after} & {c.job_id for c in dead}


@pytest.mark.parametrize("cut", ["cancel", "release"])
@pytest.mark.parametrize("limit", ["max_running", "max_running_per_group"])
@pytest.mark.parametrize(
    "limit_set",
    ["before the claim", "while it runs", "after the cut"],
)
def test_a_lease_cut_short_keeps_its_slot_until_it_would_have_ended(
    client: Client, clock: Clock, cut: str, limit: str, limit_set: str
) -> None:
    """cancel(running=True), or a release while the handler runs on (a thread
    that cannot be stopped), ends the claim but not the handler: it may run
    until its lease would have ended. Its slot was free at once, and the next
    job started beside it, two at once under a limit of one. Also for a job
    that was running when the limit was set: it counts against the limit while
    it runs, and held no slot once cut short. And for one cut short before the
    limit was set, whose handler may still run: the limit counts it too (it did
    not, and the next job started beside it)."""
    if limit_set == "before the claim":
        client.configure_queue("reports", **{limit: 1})
    cut_short, waiting = client.enqueue_many("reports", [{}, {}], group="acme")
    (claim,) = client.claim("reports", limit=1, lease=30)
    assert claim.job_id == cut_short
    if limit_set == "while it runs":
        client.configure_queue("reports", **{limit: 1})
        assert client.claim("reports", limit=5) == []
    if cut == "cancel":
        assert client.cancel(cut_short, running=True)
    else:
        client.release_many([claim], handlers_running=[True])
    if limit_set == "after the cut":
        client.configure_queue("reports", **{limit: 1})
    held = client.claim("reports", limit=5)
    assert (list(held), held.held_back) == ([], True)
    clock.advance(31)  # the cut lease would have ended
    (after,) = client.claim("reports", limit=5)  # one slot: one of them
    assert after.job_id in ({waiting, cut_short} if cut == "release" else {waiting})
    client.reap()  # maintenance drops the holds that ended
    assert _sql(client, "SELECT count(*) FROM {schema}.slot_hold") == [(0,)]


def _at_once(*calls: Callable[[], object]) -> None:
    """Run the calls in threads of their own, released together; re-raise the
    first error."""
    barrier = threading.Barrier(len(calls), timeout=60)
    errors: list[BaseException] = []

    def run(call: Callable[[], object]) -> None:
        try:
            barrier.wait()
            call()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(call,)) for call in calls]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert not any(thread.is_alive() for thread in threads)
    if errors:
        raise errors[0]


@pytest.mark.parametrize("cut", ["cancel", "release"])
def test_a_limit_set_while_a_lease_is_cut_counts_the_handler_whichever_commits_first(
    client: Client, database_url: str, cut: str
) -> None:
    """An operator sets a limit of one while another cuts the running job short:
    whichever of the two commits first, the next job must not start beside the
    handler, which may run until its lease would have ended. (The cut committed
    first left it counted by nothing.)"""
    with (
        type(client)(database_url, schema=client.schema) as cutter,
        type(client)(database_url, schema=client.schema) as operator,
    ):
        for n in range(8):
            queue = f"race{n}"
            client.enqueue_many(queue, [{}, {}])
            (claim,) = client.claim(queue, limit=1, lease=600)

            def cut_it(claim: Claim = claim) -> None:
                if cut == "cancel":
                    assert cutter.cancel(claim.job_id, running=True)
                else:
                    cutter.release_many([claim], handlers_running=[True])

            def limit_it(queue: str = queue) -> None:
                operator.configure_queue(queue, max_running=1)

            _at_once(cut_it, limit_it)
            held = client.claim(queue, limit=5)
            assert (list(held), held.held_back) == ([], True), n


@pytest.mark.parametrize("cut", ["cancel", "release"])
def test_a_job_whose_claim_raced_the_limit_holds_its_slot_once_cut(
    client: Client, clock: Clock, cut: str
) -> None:
    """A claim that read the queue's settings before configure_queue set a limit
    and committed after it starts its job as a claim without a limit does
    (configure_queue cannot mark a job not yet running: see
    mark_running_limited.sql). The row is put in that state directly, since the
    window cannot be held open from outside. Cut short, its handler may run
    until its lease would have ended: the limit counts it until then."""
    cut_short, waiting = client.enqueue_many("reports", [{}, {}])
    (claim,) = client.claim("reports", limit=1, lease=30)
    client.configure_queue("reports", max_running=1)
    _sql(client, "UPDATE {schema}.job SET limited = false WHERE job_id = %s", (cut_short,))
    if cut == "cancel":
        assert client.cancel(cut_short, running=True)
    else:
        client.release_many([claim], handlers_running=[True])
    held = client.claim("reports", limit=5)
    assert (list(held), held.held_back) == ([], True)
    clock.advance(31)
    (after,) = client.claim("reports", limit=5)
    assert after.job_id in ({waiting, cut_short} if cut == "release" else {waiting})


def test_a_lease_cut_short_after_it_expired_holds_no_slot(client: Client, clock: Clock) -> None:
    client.configure_queue("reports", max_running=1)
    cut_short, waiting = client.enqueue_many("reports", [{}, {}], max_attempts=1)
    client.claim("reports", lease=5)
    clock.advance(6)  # expired: its worker is gone, and it has no attempt left
    assert client.cancel(cut_short, running=True)
    (after,) = client.claim("reports")
    assert after.job_id == waiting


def test_an_expired_lease_is_recovered_within_the_limit(client: Client, clock: Clock) -> None:
    client.enqueue_many("reports", [{}] * 4)
    client.configure_queue("reports", max_running=2)
    crashed = client.claim("reports", limit=2, lease=5)
    clock.advance(6)
    recovered = client.claim("reports", limit=4)
    assert sorted(c.job_id for c in recovered) == sorted(c.job_id for c in crashed)
    assert all(c.recovered for c in recovered)
    assert _live(client, "reports") == 2


def test_concurrent_claimers_never_hold_more_live_leases_than_the_limit(
    client: Client, database_url: str
) -> None:
    """Eight claimers, each with a client of its own, claim and finish as fast as
    they can while a checker counts the live leases: never more than the limit.
    (Each claim counts the running jobs on a snapshot taken after the queue's
    lock: a count on the statement's snapshot would miss a claim that committed
    while it waited, and let a sixth job through.)"""
    limit = 5
    client.enqueue_many("reports", [{"n": n} for n in range(600)])
    client.configure_queue("reports", max_running=limit)
    stop = threading.Event()
    errors: list[BaseException] = []
    seen: list[int] = []
    claimed = Counter[int]()

    def claimer() -> None:
        try:
            with type(client)(database_url, schema=client.schema) as own:
                while not stop.is_set():
                    claims = own.claim("reports", limit=3)
                    claimed.update(c.job_id for c in claims)
                    if not claims:
                        if own.stats("reports")[0].queued == 0:
                            return
                        time.sleep(0.001)
                        continue
                    own.complete_many(claims)
        except BaseException as exc:
            errors.append(exc)

    def checker() -> None:
        with psycopg.connect(database_url, autocommit=True) as conn:
            while not stop.is_set():
                (count,) = conn.execute(
                    f'SELECT count(*) FROM "{client.schema}".job WHERE queue = %s'
                    f' AND status = %s AND lease_until > "{client.schema}".clock()',
                    ("reports", "running"),
                ).fetchone() or (0,)
                seen.append(int(count))

    threads = [threading.Thread(target=claimer) for _ in range(8)]
    watch = threading.Thread(target=checker)
    watch.start()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    stop.set()
    watch.join(10)
    assert not errors, errors
    assert max(seen) <= limit, Counter(seen)
    assert max(seen) == limit  # the limit was reached, so it was tested
    assert len(claimed) == 600
    assert set(claimed.values()) == {1}


# -- groups ------------------------------------------------------------------------


def test_a_group_at_its_limit_never_holds_up_the_others(client: Client) -> None:
    client.enqueue_many("mail", [{"n": n} for n in range(1000)], group="big")
    client.enqueue_many("mail", [{"n": n} for n in range(3)], group="small")
    client.enqueue_many("mail", [{"n": n} for n in range(2)])
    client.configure_queue("mail", max_running_per_group=2)
    first = client.claim("mail", limit=10)
    assert Counter(c.group for c in first) == {"big": 2, "small": 2, None: 2}
    assert first.held_back
    # big and small are full: what is left of the others still comes.
    client.enqueue("mail", {}, group="late")
    second = client.claim("mail", limit=10)
    assert Counter(c.group for c in second) == {"late": 1}
    client.complete_many([c for c in first if c.group == "small"][:1])
    third = client.claim("mail", limit=10)
    assert Counter(c.group for c in third) == {"small": 1}


def test_max_running_holds_across_groups_and_ungrouped_jobs(client: Client) -> None:
    for group in ("a", "b", "c"):
        client.enqueue_many("mail", [{}] * 10, group=group)
    client.enqueue_many("mail", [{}] * 10)
    client.configure_queue("mail", max_running=6, max_running_per_group=3)
    claims = client.claim("mail", limit=50)
    assert len(claims) == 6
    assert max(Counter(c.group for c in claims).values()) <= 3
    assert len(client.claim("mail", limit=50)) == 0


def test_groups_take_turns_so_a_small_group_is_not_starved(client: Client) -> None:
    client.enqueue_many("mail", [{"n": n} for n in range(2000)], group="big")
    small = client.enqueue_many("mail", [{"n": n} for n in range(10)], group="small")
    order: list[str | None] = []
    while len(order) < 40:
        order += [c.group for c in client.claim("mail", limit=4)]
    # Every small job within the first 20 starts: the groups alternate.
    assert order[:20].count("small") == 10, order
    assert {c.job_id for c in client.list_jobs("running", queue="mail", limit=100)} >= set(small)


def test_the_ungrouped_jobs_take_one_turn_like_a_group(client: Client) -> None:
    client.enqueue_many("mail", [{}] * 50, group="a")
    client.enqueue_many("mail", [{}] * 50, group="b")
    client.enqueue_many("mail", [{}] * 50)
    counts = Counter[str | None]()
    for _ in range(10):
        counts.update(c.group for c in client.claim("mail", limit=3))
    assert counts == {"a": 10, "b": 10, None: 10}


def test_turns_go_on_from_claim_to_claim(client: Client) -> None:
    for group in ("a", "b", "c", "d"):
        client.enqueue_many("mail", [{}] * 5, group=group)
    singles = [client.claim("mail", limit=1)[0].group for _ in range(8)]
    assert singles == ["a", "b", "c", "d", "a", "b", "c", "d"]


def test_a_group_keeps_priority_and_age_within_itself(client: Client) -> None:
    low = client.enqueue("mail", {}, group="a")
    high = client.enqueue("mail", {}, group="a", priority=5)
    later = client.enqueue("mail", {}, group="a", delay=3600)
    claims = client.claim("mail", limit=5)
    assert [c.job_id for c in claims] == [high, low]
    assert later not in {c.job_id for c in claims}


def test_ordering_keys_keep_their_order_and_exclusion_inside_groups(client: Client) -> None:
    client.configure_queue("mail", max_running_per_group=10)
    ids = [client.enqueue("mail", {"n": n}, group="g", key="k", seq=n) for n in range(3)]
    first = client.claim("mail", limit=10)
    assert [c.job_id for c in first] == ids[:1]  # one at a time
    client.complete(first[0])
    assert [c.job_id for c in client.claim("mail", limit=10)] == ids[1:2]


def test_a_replayed_or_retried_job_keeps_its_group(client: Client) -> None:
    job_id = client.enqueue("mail", {}, group="g", max_attempts=2)
    (claim,) = client.claim("mail")
    client.fail(claim, "boom")  # failed at once, attempts left or not
    assert client.replay(job_id)
    (again,) = client.claim("mail")
    assert again.group == "g"
    assert client.get(job_id).group == "g"
    client.retry(again, delay=0)
    assert client.claim("mail")[0].group == "g"


def test_grouped_jobs_are_counted_and_found(client: Client) -> None:
    client.enqueue_many("mail", [{}] * 3, group="g")
    client.enqueue("mail", {})
    unique = client.enqueue("mail", {}, group="u", unique_key="once")
    assert client.enqueue("mail", {}, group="u", unique_key="once") == unique
    (stats,) = client.stats("mail")
    assert stats.queued == 5
    assert stats.oldest_ready_age is not None
    assert Counter(j.group for j in client.list_jobs("queued", queue="mail")) == {
        "g": 3,
        None: 1,
        "u": 1,
    }
    assert client.get(unique).group == "u"


# -- grouped jobs that wait (migration 0017) ----------------------------------------


def test_a_grouped_job_that_waits_starts_once_due_and_not_before(
    client: Client, clock: Clock
) -> None:
    """Delayed, retried with a backoff, keyed: a grouped job queued for later is
    never claimed early, and one claim() takes it once it is due (the claim that
    makes it ready cannot take it itself: the client claims again)."""
    later = client.enqueue("mail", {"n": 1}, group="a", delay=60)
    latest = client.enqueue("mail", {"n": 2}, group="b", delay=120)
    now = client.enqueue("mail", {"n": 3}, group="c")
    head = client.enqueue("mail", {"n": 4}, group="d", key="k", seq=1, delay=60)
    behind = client.enqueue("mail", {"n": 5}, group="d", key="k", seq=2)
    assert client.stats("mail")[0].queued == 5
    (first,) = client.claim("mail", limit=10)
    assert first.job_id == now
    client.complete(first)
    clock.advance(59)
    assert client.claim("mail", limit=10) == []
    clock.advance(2)
    due = client.claim("mail", limit=10)
    assert sorted(c.job_id for c in due) == sorted([later, head])
    assert client.claim("mail", limit=10) == []  # the key's next waits for its head
    for claim in due:
        client.complete(claim)
    (next_of_key,) = client.claim("mail", limit=10)
    assert next_of_key.job_id == behind
    client.complete(next_of_key)
    clock.advance(60)
    (retried,) = client.claim("mail", limit=10)
    assert retried.job_id == latest
    client.retry(retried, delay=30)  # a backoff: waits again
    assert client.claim("mail", limit=10) == []
    clock.advance(31)
    assert [c.job_id for c in client.claim("mail", limit=10)] == [latest]


def test_a_job_that_came_due_keeps_its_priority_in_its_group(client: Client, clock: Clock) -> None:
    """The claim that makes a job which waited ready cannot take it in its own
    statement: it took the group's lower-priority job instead."""
    low = client.enqueue("mail", {"p": "low"}, group="a")
    high = client.enqueue("mail", {"p": "high"}, group="a", priority=10, delay=60)
    clock.advance(61)
    (first,) = client.claim("mail", limit=1)
    assert first.job_id == high
    client.complete(first)
    assert [c.job_id for c in client.claim("mail", limit=1)] == [low]


def test_a_burst_coming_due_in_a_full_group_holds_up_no_other_group(
    client: Client, clock: Clock
) -> None:
    """5,000 jobs of a group at its limit come due with one job of a group with
    room: one claim() starts the latter (the claims make the due jobs ready
    1,000 at a time, in time order)."""
    client.configure_queue("mail", max_running_per_group=1)
    client.enqueue("mail", {}, group="busy")
    (running,) = client.claim("mail", lease=3600)
    client.enqueue_many("mail", [{"n": n} for n in range(5000)], group="busy", delay=60)
    waiting = client.enqueue("mail", {}, group="free", delay=61)
    clock.advance(62)
    assert [c.job_id for c in client.claim("mail", limit=10)] == [waiting]
    assert running.group == "busy"


def test_jobs_that_came_due_keep_their_groups_limits(client: Client, clock: Clock) -> None:
    client.configure_queue("mail", max_running_per_group=1)
    client.enqueue_many("mail", [{"n": n} for n in range(3)], group="a", delay=60)
    client.enqueue_many("mail", [{"n": n} for n in range(3)], group="b", delay=60)
    clock.advance(61)
    claims = client.claim("mail", limit=10)
    assert sorted(c.group or "" for c in claims) == ["a", "b"]
    assert client.claim("mail", limit=10) == []


def test_a_cancelled_job_that_waited_never_starts(client: Client, clock: Clock) -> None:
    job_id = client.enqueue("mail", {}, group="a", delay=60)
    assert client.cancel(job_id)
    clock.advance(61)
    assert client.claim("mail", limit=10) == []
    assert client.get(job_id).status == "cancelled"


def test_thousands_of_groups_coming_due_at_once_each_start_once(
    client: Client, clock: Clock
) -> None:
    """A claim makes at most 1,000 jobs that waited ready; the rest follow in
    later claims, none lost and none twice."""
    ids = client.enqueue_many("mail", [{"n": n} for n in range(2500)], delay=60)
    with client.connection() as conn:  # one group each: the worst case for the walk
        conn.execute(
            f"UPDATE \"{client.schema}\".job SET group_key = 'g' || job_id WHERE queue = 'mail'"
        )
    clock.advance(61)
    first = client.claim("mail", limit=100)
    assert len(first) == 100
    started = [c.job_id for c in first]
    while claims := client.claim("mail", limit=500):
        started += [c.job_id for c in claims]
    assert Counter(started) == Counter(ids)


# -- rate limits -------------------------------------------------------------------


def test_a_full_groups_expired_leases_hold_up_no_other_groups_recovery(
    client: Client, clock: Clock
) -> None:
    """A worker died holding 150 jobs of one tenant and one of another: once the
    first tenant is at its limit again, the other's expired lease is recovered all
    the same. (The claim read the oldest expired leases, its limit plus 100, and
    passed over those of full groups: the other tenant's lease was never read.)"""
    client.enqueue_many("mail", [{}] * 150, group="big")
    assert len(client.claim("mail", limit=150, lease=1)) == 150
    small = client.enqueue("mail", {}, group="small")
    client.claim("mail", limit=1, lease=1)
    client.configure_queue("mail", max_running_per_group=1)
    clock.advance(5)  # every lease has expired
    claims = client.claim("mail", limit=5, lease=600)
    claims += client.claim("mail", limit=5, lease=600)
    assert small in {c.job_id for c in claims}, [c.group for c in claims]
    assert Counter(c.group for c in claims)["big"] == 1


def test_a_rate_limit_lets_at_most_its_starts_through_per_window(
    client: Client, clock: Clock
) -> None:
    client.enqueue_many("api", [{"n": n} for n in range(40)])
    client.configure_queue("api", rate_limit=(5, 10))
    starts: list[float] = []
    first = client.claim("api", limit=10)
    assert (len(first), first.held_back) == (5, True)
    starts += [clock.offset] * 5
    held = client.claim("api", limit=10)
    assert len(held) == 0
    assert held.held_back
    assert held.retry_in is not None
    assert 9.5 < held.retry_in <= 10.6
    client.complete_many(first)  # finishing frees no rate room
    assert len(client.claim("api", limit=10)) == 0
    clock.advance(5)
    assert len(client.claim("api", limit=10)) == 0
    clock.advance(5.6)
    second = client.claim("api", limit=10)
    assert len(second) == 5
    starts += [clock.offset] * 5
    for _ in range(6):  # a few more windows, in uneven steps
        clock.advance(3.7)
        claims = client.claim("api", limit=2)
        starts += [clock.offset] * len(claims)
    assert most_in_any_window(starts, 10) <= 5
    assert len(starts) >= 15


def test_a_claim_that_waited_for_its_turn_is_stamped_when_it_took_its_jobs(
    client: Client, database_url: str
) -> None:
    """Claims of a rate-limited queue take turns. One that waited for its turn
    must not be recorded as claimed when it began waiting: the database's
    claimed_at would then show more starts in a period than the limit."""
    client.enqueue_many("api", [{"n": n} for n in range(10)])
    client.configure_queue("api", rate_limit=(5, 1))
    first = client.claim("api", limit=10)
    assert len(first) == 5
    late: list[Any] = []
    with psycopg.connect(database_url, autocommit=True) as holder:
        with holder.transaction():
            # Another claim's turn, held for longer than the period.
            holder.execute(
                f'SELECT 1 FROM "{client.schema}".claim_turn WHERE queue = %s FOR UPDATE',
                ("api",),
            )
            waiting = threading.Thread(target=lambda: late.extend(client.claim("api", limit=10)))
            waiting.start()
            time.sleep(1.3)
        waiting.join(10)
    assert len(late) == 5  # the window had room again when its turn came
    claimed = [
        at.timestamp()
        for (at,) in _sql(client, "SELECT claimed_at FROM {schema}.job WHERE queue = 'api'")
    ]
    assert most_in_any_window(claimed, 1.0) <= 5


def test_a_rate_limit_per_group_never_holds_up_the_others(client: Client, clock: Clock) -> None:
    client.enqueue_many("api", [{}] * 30, group="busy")
    client.enqueue_many("api", [{}] * 30, group="calm")
    client.configure_queue("api", rate_limit_per_group=(3, 60))
    first = client.claim("api", limit=20, lease=600)
    assert Counter(c.group for c in first) == {"busy": 3, "calm": 3}
    assert first.held_back
    assert first.retry_in is not None
    assert first.retry_in > 59
    client.enqueue("api", {}, group="new")
    assert [c.group for c in client.claim("api", limit=20, lease=600)] == ["new"]
    clock.advance(62)
    assert Counter(c.group for c in client.claim("api", limit=20)) == {"busy": 3, "calm": 3}


def test_rate_and_concurrency_limits_together(client: Client, clock: Clock) -> None:
    client.enqueue_many("api", [{}] * 30)
    client.configure_queue("api", rate_limit=(4, 60), max_running=3)
    first = client.claim("api", limit=10)
    assert len(first) == 3
    client.complete_many(first)
    assert len(client.claim("api", limit=10, lease=600)) == 1  # the window's fourth start
    clock.advance(61)
    assert len(client.claim("api", limit=10)) == 2  # one still runs


# -- groups at their limits, passed over (migration 0018) ---------------------------


def _claim_all(client: Client, queue: str) -> list[Any]:
    """Claim and complete until a claim starts nothing; what was started, in order."""
    started = []
    while claims := client.claim(queue, limit=100):
        started.extend(claims)
        client.complete_many(claims)
    return started


def test_groups_at_their_rate_never_start_early_and_the_first_to_have_room_is_said(
    client: Client, clock: Clock
) -> None:
    """Many groups whose rate window is full, among groups with room, before and
    after them in the walk's order: only those with room start, and the claim
    says when the first full one has room again (not later: its jobs would wait
    for a poll; not at once: the worker would claim in a busy loop)."""
    client.configure_queue("api", rate_limit_per_group=(1, 60))
    early = [f"t{n:03d}" for n in range(0, 60, 2)]
    late = [f"t{n:03d}" for n in range(1, 60, 2)]
    for group in early:
        client.enqueue_many("api", [{"group": group}] * 2, group=group)
    assert sorted(c.group for c in _claim_all(client, "api")) == early  # one each
    clock.advance(20)
    for group in late:
        client.enqueue_many("api", [{"group": group}] * 2, group=group)
    assert sorted(c.group for c in _claim_all(client, "api")) == late
    clock.advance(10)  # the early windows have room 30 s from now, the late ones 50 s
    for group in ("a", "t031x", "u"):  # before, among and after the full ones
        client.enqueue("api", {"group": group}, group=group)
    claims = client.claim("api", limit=100)
    assert sorted(c.group for c in claims) == ["a", "t031x", "u"]
    client.complete_many(claims)
    idle = client.claim("api", limit=100)
    assert (len(idle), idle.held_back) == (0, True)
    assert idle.retry_in is not None
    # (The database's clock runs on between these calls: under load, seconds.)
    assert 20 < idle.retry_in <= 31
    clock.advance(idle.retry_in + 0.1)
    assert sorted(c.group for c in _claim_all(client, "api")) == early
    # (20 s after the early ones, and a window's starts are stamped up to 0.5 s
    # late: rate_started()'s slots of a 128th of the period.)
    clock.advance(21)
    assert sorted(c.group for c in _claim_all(client, "api")) == late
    assert client.stats("api")[0].queued == 0


def test_groups_at_their_running_limit_are_passed_over_until_a_job_of_theirs_ends(
    client: Client,
) -> None:
    """Tenants each running their one job, among groups with room: only those
    with room start, the claim says it was held back with no time to come back
    (a job's end announces its slot), and a job that ends frees its own group
    only: never two running jobs of one group."""
    client.configure_queue("api", max_running_per_group=1)
    full = [f"t{n:03d}" for n in range(40)]
    for group in full:
        client.enqueue_many("api", [{"group": group}] * 2, group=group)
    running = {c.group: c for c in client.claim("api", limit=100, lease=600)}
    assert sorted(running) == full
    for group in ("a", "t017x", "u"):  # before, among and after the full ones
        client.enqueue("api", {"group": group}, group=group)
    fresh = client.claim("api", limit=100, lease=600)
    assert sorted(c.group for c in fresh) == ["a", "t017x", "u"]
    idle = client.claim("api", limit=100)
    assert (len(idle), idle.held_back, idle.retry_in) == (0, True, None)
    client.complete(running["t017"])
    client.complete(running["t033"])
    after = client.claim("api", limit=100, lease=600)
    assert sorted(c.group for c in after) == ["t017", "t033"]
    live = _sql(
        client,
        "SELECT group_key, count(*) FROM {schema}.job WHERE queue = 'api'"
        " AND status = 'running' GROUP BY group_key HAVING count(*) > 1",
    )
    assert live == []


def test_groups_at_either_limit_are_passed_over(client: Client, clock: Clock) -> None:
    """A queue with both per-group limits: a group full for its rate and one
    full for its running jobs are both passed over; the claim's wait is the
    rate window's, and a group with room under both starts."""
    client.configure_queue("api", max_running_per_group=2, rate_limit_per_group=(3, 60))
    client.enqueue_many("api", [{}] * 5, group="rated")
    client.enqueue_many("api", [{}] * 5, group="running")
    first = client.claim("api", limit=100, lease=600)
    assert Counter(c.group for c in first) == {"rated": 2, "running": 2}
    client.complete_many([c for c in first if c.group == "rated"])
    (third,) = client.claim("api", limit=100, lease=600)  # its window's third start
    assert third.group == "rated"
    client.complete(third)
    client.enqueue("api", {}, group="open")
    (opened,) = client.claim("api", limit=100, lease=600)
    assert opened.group == "open"
    idle = client.claim("api", limit=100, lease=600)
    assert (len(idle), idle.held_back) == (0, True)
    assert idle.retry_in is not None
    assert 50 < idle.retry_in <= 61
    clock.advance(idle.retry_in + 0.1)
    # (The running group's leases are 600 s: still live, still full.)
    assert Counter(c.group for c in client.claim("api", limit=100, lease=600)) == {"rated": 2}


def test_an_expired_lease_held_back_by_its_group_rate_says_when(
    client: Client, clock: Clock
) -> None:
    """The group's only job is a crashed attempt whose lease expired while its
    window is full: the claim must say when it may recover it, or the job
    waits for a poll."""
    client.configure_queue("api", rate_limit_per_group=(1, 60))
    client.enqueue("api", {}, group="a")
    (crashed,) = client.claim("api", limit=1, lease=5)
    clock.advance(10)  # its lease ended; its group's window still holds its start
    held = client.claim("api", limit=10)
    assert (len(held), held.held_back) == (0, True)
    assert held.retry_in is not None
    assert 40 < held.retry_in <= 51
    clock.advance(held.retry_in + 0.1)
    (recovered,) = client.claim("api", limit=10)
    assert (recovered.job_id, recovered.recovered) == (crashed.job_id, True)


def test_a_raised_group_rate_holds_from_the_next_claim(client: Client) -> None:
    """A group passed over as full must not stay passed over once its limit is
    raised: the limit is the queue's setting of the claim, not of the window."""
    client.configure_queue("api", rate_limit_per_group=(1, 3600))
    groups = [f"g{n:02d}" for n in range(40)]
    for group in groups:
        client.enqueue_many("api", [{"group": group}] * 3, group=group)
    assert sorted(c.group for c in _claim_all(client, "api")) == groups
    client.configure_queue("api", rate_limit_per_group=(2, 3600))
    assert sorted(c.group for c in _claim_all(client, "api")) == groups
    client.configure_queue("api", rate_limit_per_group=None)
    assert sorted(c.group for c in _claim_all(client, "api")) == groups
    assert client.stats("api")[0].queued == 0


# -- the worker is told ------------------------------------------------------------


def test_a_finished_limited_job_announces_its_free_slot(client: Client, database_url: str) -> None:
    client.enqueue_many("reports", [{}] * 3)
    client.configure_queue("reports", max_running=2)
    claims = client.claim("reports", limit=3)
    with psycopg.connect(database_url, autocommit=True) as listener:
        listener.execute(f'LISTEN "{notify_channel(client.schema)}"')
        client.complete(claims[0])
        got = [n.payload for n in listener.notifies(timeout=5, stop_after=1)]
    assert got == ["reports"]


def test_the_databases_channel_name_is_the_clients(client: Client) -> None:
    """The trigger names the schema's channel itself (work_channel()): as the
    client does, or a freed slot would be announced where no worker listens."""
    for schema in ("s", "x" * 40, "y" * 56, "z" * 57, "é" * 60, client.schema):
        ((name,),) = _sql(client, "SELECT {schema}.work_channel(%s)", (schema,))
        assert name == notify_channel(schema), schema


def test_a_paused_limited_queue_claims_nothing(client: Client) -> None:
    client.enqueue_many("reports", [{}] * 3, group="g")
    client.configure_queue("reports", max_running=2, paused=True)
    claims = client.claim("reports", limit=3)
    assert (len(claims), claims.held_back) == (0, False)


# -- settings and bad input ----------------------------------------------------------


def test_limits_are_read_back_and_lifted(client: Client) -> None:
    client.configure_queue(
        "api",
        max_running=4,
        max_running_per_group=2,
        rate_limit=(50, 1),
        rate_limit_per_group=(5, 0.5),
    )
    settings = client.queue_settings("api")
    assert settings is not None
    assert (settings.max_running, settings.max_running_per_group) == (4, 2)
    assert (settings.rate_limit, settings.rate_limit_per_group) == ((50, 1.0), (5, 0.5))
    client.configure_queue("api", rate_limit=None, max_running=None)
    settings = client.queue_settings("api")
    assert settings is not None
    assert (settings.max_running, settings.rate_limit) == (None, None)
    assert settings.max_running_per_group == 2


@pytest.mark.parametrize(
    "settings",
    [
        {"max_running": 0},
        {"max_running": -1},
        {"max_running": 2.5},
        {"max_running": True},
        {"max_running_per_group": "3"},
        {"rate_limit": (0, 1)},
        {"rate_limit": (5, 0)},
        {"rate_limit": (5, -1)},
        {"rate_limit": (5,)},
        {"rate_limit": "50/s"},
        {"rate_limit": (5, float("inf"))},
        {"rate_limit_per_group": (1.5, 1)},
        # A period shorter than the database's clock can tell apart: the claims
        # of the queue then failed with an overflow, and the queue stood still.
        {"rate_limit": (5, 1e-300)},
        {"rate_limit_per_group": (5, 1e-300)},
        {"rate_limit": (5, 1e-7)},
    ],
)
def test_bad_limits_are_refused_and_change_nothing(
    client: Client, settings: dict[str, Any]
) -> None:
    client.configure_queue("api", max_running=7)
    with pytest.raises(InvalidArgument):
        client.configure_queue("api", **settings)
    after = client.queue_settings("api")
    assert after is not None
    assert after.max_running == 7
    assert after.rate_limit is None


@pytest.mark.parametrize("group", ["", "a\x00b", "g" * 256, 7])
def test_a_bad_group_is_refused_and_writes_nothing(client: Client, group: Any) -> None:
    with pytest.raises(InvalidJob):
        client.enqueue("mail", {}, group=group)
    with pytest.raises(InvalidJob):
        client.enqueue_many("mail", [{}], group=group)
    assert client.list_jobs("queued", queue="mail") == []


def test_a_rate_window_keeps_a_bounded_bookkeeping_whatever_the_claims(
    client: Client, clock: Clock
) -> None:
    """Every claim reads and rewrites its queue's window: one entry per claim made a
    long period's window, and each claim, grow without bound. The limit still holds."""
    client.enqueue_many("api", [{}] * 400)
    client.configure_queue("api", rate_limit=(100_000, 3600))
    starts: list[float] = []
    for _ in range(400):  # one start every 10 s: about 360 of them in each window
        (claim,) = client.claim("api")
        starts.append(clock.offset)
        client.complete(claim)
        clock.advance(10)
    with client.connection() as conn:
        (entries,) = conn.execute(
            f'SELECT cardinality(started_at) FROM "{client.schema}".claim_turn'
            " WHERE queue = 'api'"
        ).fetchone()
    assert entries <= 150
    assert len(starts) == 400
