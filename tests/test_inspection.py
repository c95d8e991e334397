"""What operators read and do: searches and summaries, the audit log, cancelling a
running job through the fence. Both client legs, against the real database."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import pytest

import leaseq
from leaseq import JobStatus, LeaseLost, _steps

from .clients import Client
from .conftest import Clock


def _fail(client: Client, queue: str, error: str, **enqueue: object) -> int:
    # (the highest priority: claimed before whatever else the queue holds)
    job_id = client.enqueue(queue, {"n": 1}, max_attempts=1, priority=1000, **enqueue)  # type: ignore[arg-type]
    (claim,) = client.claim(queue)
    assert claim.job_id == job_id
    client.fail(claim, error)
    return job_id


# -- find_jobs -----------------------------------------------------------------------


def test_find_jobs_filters_by_every_field_newest_first(client: Client) -> None:
    acme = [client.enqueue("reports", {"customer": "acme", "n": n}) for n in range(3)]
    client.enqueue("reports", {"customer": "globex", "n": 9})
    keyed = client.enqueue("mail", {"to": "x"}, key="user:1")
    failed = _fail(client, "mail", "SMTPError: mailbox unavailable")

    page = client.find_jobs(payload={"customer": "acme"})
    assert [j.job_id for j in page.jobs] == acme[::-1]
    assert page.next_before is None
    assert [j.job_id for j in client.find_jobs(key="user:1").jobs] == [keyed]
    assert [j.job_id for j in client.find_jobs(error="mailbox UNAVAILABLE").jobs] == [failed]
    assert [j.job_id for j in client.find_jobs(status="failed", queue="mail").jobs] == [failed]
    assert client.find_jobs(status=JobStatus.FAILED, queue="reports").jobs == ()
    both = client.find_jobs(queue="reports", payload={"customer": "acme", "n": 1})
    assert [j.job_id for j in both.jobs] == [acme[1]]


def test_find_jobs_pages_by_keyset_without_gaps_or_repeats(client: Client) -> None:
    ids = client.enqueue_many("reports", [{"n": n} for n in range(23)])
    seen: list[int] = []
    before = None
    pages = 0
    while True:
        page = client.find_jobs(queue="reports", limit=5, before=before)
        seen += [j.job_id for j in page.jobs]
        pages += 1
        if page.next_before is None:
            break
        before = page.next_before
    assert seen == sorted(ids, reverse=True)
    assert pages == 5


def test_find_jobs_pages_through_one_window_while_jobs_are_enqueued(client: Client) -> None:
    """Paging on while producers enqueue must neither skip nor repeat a job of the
    window the first page searched: each page measured its window from the newest
    job id of its own time, so every new job pushed one job of the first page's
    window, not shown yet, out of the next page's (a busy queue's pages ran dry)."""
    for status in (None, "failed"):
        first = [_fail(client, "mail", "boom") for _ in range(3)] if status else []
        first += client.enqueue_many("mail", [{"n": n} for n in range(20)])
        seen: list[int] = []
        page = client.find_jobs(queue="mail", status=status, limit=4, window=30)
        while True:
            seen += [j.job_id for j in page.jobs]
            client.enqueue_many("mail", [{"n": n} for n in range(6)])  # between pages
            if page.next_before is None:
                break
            page = client.find_jobs(
                queue="mail",
                status=status,
                limit=4,
                window=30,
                before=page.next_before,
                window_top=page.window_top,
            )
        expected = [i for i in first if status is None or client.get(i).status.value == status]
        assert seen[: len(expected)] == sorted(expected, reverse=True)[: len(seen)], status
        assert set(expected) <= set(seen), status
        assert len(seen) == len(set(seen)), status


def test_find_jobs_window_top_never_widens_the_window(client: Client) -> None:
    """A ``window_top`` below the newest job id moves the window down, never wider:
    ids above it are not read, however far below it ``before`` lies."""
    ids = client.enqueue_many("reports", [{"n": n} for n in range(30)])
    page = client.find_jobs(window=10, window_top=ids[19], before=ids[-1])
    assert [j.job_id for j in page.jobs] == ids[10:20][::-1]
    assert page.window_end
    assert client.find_jobs(window=10).window_top == ids[-1]


def test_find_jobs_searches_only_the_newest_window(client: Client) -> None:
    old = client.enqueue("reports", {"needle": True})
    client.enqueue_many("reports", [{"n": n} for n in range(30)])
    page = client.find_jobs(payload={"needle": True}, window=10)
    assert page.jobs == ()
    assert page.window_end  # older jobs were not searched: say so
    wide = client.find_jobs(payload={"needle": True}, window=1000)
    assert [j.job_id for j in wide.jobs] == [old]
    assert not wide.window_end


def test_find_jobs_of_failed_jobs_is_not_bounded_by_the_window_of_job_ids(
    client: Client,
) -> None:
    """Failed jobs stay until replayed: a search of them reads their index, the
    newest ``window`` failures of each queue, not the newest ``window`` job ids,
    which newer jobs of any queue push them out of."""
    old = [_fail(client, "mail", "boom") for _ in range(3)]
    client.enqueue_many("reports", [{"n": n} for n in range(30)])
    page = client.find_jobs(status="failed", window=10)
    assert [j.job_id for j in page.jobs] == old[::-1]
    assert not page.window_end
    by_error = client.find_jobs(status="failed", queue="mail", error="BOOM", window=10, limit=2)
    assert [j.job_id for j in by_error.jobs] == old[:0:-1]
    assert by_error.next_before == old[1]
    rest = client.find_jobs(status="failed", error="boom", window=10, before=old[1])
    assert [j.job_id for j in rest.jobs] == [old[0]]
    # The newest 2 failures of each queue: older ones are not searched, and it says so.
    capped = client.find_jobs(status="failed", window=2)
    assert [j.job_id for j in capped.jobs] == old[:0:-1]
    assert capped.window_end


def test_find_jobs_reports_the_lease_remaining_of_running_jobs(client: Client) -> None:
    client.enqueue("reports", {})
    client.claim("reports", lease=30)
    (running,) = client.find_jobs(status="running").jobs
    assert running.lease_remaining is not None
    assert 25 < running.lease_remaining <= 30


@pytest.mark.parametrize(
    "filters",
    [
        {"status": "nope"},
        {"payload": ["not", "a", "mapping"]},
        {"payload": {}},
        {"payload": {"customer": "a\x00b"}},  # jsonb has no NUL
        {"payload": {"a\x00": 1}},
        {"payload": {"nested": [{"x": "\x00"}]}},
        {"error": ""},
        {"limit": 0},
        {"limit": 1001},
        {"window": 0},
        {"before": -1},
        {"queue": "bad queue"},
    ],
)
def test_find_jobs_refuses_bad_filters(client: Client, filters: dict[str, object]) -> None:
    with pytest.raises(leaseq.InvalidArgument):
        client.find_jobs(**filters)  # type: ignore[arg-type]


# -- summaries -----------------------------------------------------------------------


def test_failed_groups_count_jobs_by_queue_and_error(client: Client) -> None:
    for _ in range(3):
        _fail(client, "mail", "SMTPError: mailbox unavailable")
    newest = _fail(client, "mail", "TimeoutError: no answer")
    _fail(client, "reports", "SMTPError: mailbox unavailable")
    summary = client.failed_groups()
    groups = {(g.queue, g.error): g.count for g in summary.groups}
    assert groups == {
        ("mail", "SMTPError: mailbox unavailable"): 3,
        ("mail", "TimeoutError: no answer"): 1,
        ("reports", "SMTPError: mailbox unavailable"): 1,
    }
    assert summary.groups[0].count == 3  # largest first
    assert summary.scanned == 5
    assert not summary.capped
    (timeout,) = [g for g in summary.groups if g.error == "TimeoutError: no answer"]
    assert timeout.newest_job_id == newest
    only_reports = client.failed_groups("reports")
    assert [(g.queue, g.count) for g in only_reports.groups] == [("reports", 1)]


def test_failed_groups_take_an_empty_error_text_for_none(client: Client) -> None:
    """An empty error text and none read alike ("no error text"): one group, not
    two that no one can tell apart."""
    _fail(client, "mail", "")
    _fail(client, "mail", None)  # type: ignore[arg-type]
    assert [(g.error, g.count) for g in client.failed_groups("mail").groups] == [(None, 2)]


def test_blocked_keys_name_the_failed_head_and_what_waits(client: Client) -> None:
    head = client.enqueue("mail", {"n": 0}, key="user:1", max_attempts=1)
    waiting = [client.enqueue("mail", {"n": n}, key="user:1") for n in range(1, 4)]
    client.enqueue("mail", {"n": 0}, key="user:2")
    (claim,) = client.claim("mail", limit=1)
    assert claim.job_id == head
    client.fail(claim, "ValueError: bad address")

    (blocked,) = client.blocked_keys()
    assert (blocked.queue, blocked.key, blocked.head_job_id) == ("mail", "user:1", head)
    assert blocked.head_error == "ValueError: bad address"
    assert blocked.waiting == len(waiting)
    assert not blocked.waiting_capped
    # Skipping the head (cancel) releases the key: it is no longer blocked.
    assert client.cancel(head)
    assert client.blocked_keys() == []
    (next_claim,) = client.claim("mail", limit=1)
    assert next_claim.job_id == waiting[0]


def test_a_key_under_continue_is_not_blocked(client: Client) -> None:
    client.configure_queue("mail", ordering_policy="continue")
    head = client.enqueue("mail", {}, key="k", max_attempts=1)
    client.enqueue("mail", {}, key="k")
    (claim,) = client.claim("mail")
    assert claim.job_id == head
    client.fail(claim, "boom")
    assert client.blocked_keys() == []


def test_activity_counts_finished_jobs_per_minute_with_durations(
    client: Client, clock: Clock
) -> None:
    client.enqueue_many("reports", [{"n": n} for n in range(4)])
    claims = client.claim("reports", limit=4)
    clock.advance(2.0)
    for claim in claims[:3]:
        client.complete(claim)
    client.fail(claims[3], "boom")
    (activity,) = client.activity(minutes=60)
    assert activity.queue == "reports"
    assert len(activity.per_minute) == 60
    starts = [m.start for m in activity.per_minute]
    assert starts == sorted(starts)
    assert sum(m.done for m in activity.per_minute) == 3
    assert sum(m.failed for m in activity.per_minute) == 1
    assert activity.per_minute[-1].done + activity.per_minute[-2].done == 3  # just now
    assert activity.p50 is not None
    assert 1.5 < activity.p50 < 10
    assert activity.p99 is not None
    assert activity.p99 >= activity.p50
    assert not activity.sampled
    # An hour later they are out of the window.
    clock.advance(3700)
    (later,) = client.activity(minutes=60)
    assert sum(m.done + m.failed for m in later.per_minute) == 0
    assert later.p50 is None


# -- actions and the audit log --------------------------------------------------------


def test_every_action_writes_one_audit_row_with_its_actor(client: Client) -> None:
    failed = [_fail(client, "mail", "boom") for _ in range(3)]
    queued = client.enqueue("mail", {})
    assert client.replay(failed[0], actor="dashboard:alice")
    assert client.replay_many(failed[1:], actor="dashboard:bob") == failed[1:]
    assert client.cancel(queued, actor="cli:carol")
    client.configure_queue("mail", paused=True, actor="dashboard:alice")
    client.configure_queue("mail", paused=False, max_attempts=7)
    # An action that changes nothing is not an action on a job.
    assert not client.cancel(queued, actor="dashboard:alice")
    # Nor is a configure that names no setting (`leaseq queue configure Q` shows them).
    assert client.configure_queue("mail", actor="cli:carol").max_attempts == 7

    log = client.audit_log()
    assert [(e.action, e.actor, e.job_ids) for e in log[1:]] == [
        ("pause", "dashboard:alice", ()),
        ("cancel", "cli:carol", (queued,)),
        ("replay", "dashboard:bob", tuple(failed[1:])),
        ("replay", "dashboard:alice", (failed[0],)),
    ]
    newest = log[0]
    assert newest.action == "configure"
    assert newest.actor  # the database role when no actor is named
    assert newest.detail == {"paused": False, "max_attempts": 7}
    assert all(e.queue == "mail" for e in log)
    assert [e.audit_id for e in client.audit_log(before=log[1].audit_id, limit=2)] == [
        log[2].audit_id,
        log[3].audit_id,
    ]
    assert client.get(failed[0]).history[-1]["actor"] == "dashboard:alice"


def test_replay_many_replays_only_failed_or_cancelled_jobs(client: Client) -> None:
    failed = _fail(client, "mail", "boom")
    done = client.enqueue("mail", {})
    (claim,) = client.claim("mail")
    client.complete(claim)
    running = client.enqueue("mail", {})
    (held,) = client.claim("mail")
    assert client.replay_many([failed, done, running]) == [failed]
    assert client.get(done).status is JobStatus.DONE
    assert client.get(running).status is JobStatus.RUNNING
    assert held.job_id == running
    with pytest.raises(leaseq.InvalidArgument):
        client.replay_many([0])


def test_replay_many_only_failed_leaves_a_job_skipped_meanwhile_skipped(client: Client) -> None:
    """An operator confirmed a replay of two failed jobs; someone skipped one since."""
    kept, skipped = _fail(client, "mail", "boom"), _fail(client, "mail", "boom")
    assert client.cancel(skipped)
    assert client.replay_many([kept, skipped], only_failed=True) == [kept]
    assert client.get(skipped).status is JobStatus.CANCELLED
    assert client.get(kept).status is JobStatus.QUEUED
    with pytest.raises(leaseq.InvalidArgument):
        client.replay_many([kept], only_failed="yes")  # type: ignore[arg-type]


def test_replay_many_with_lease_versions_leaves_a_job_that_changed_since_alone(
    client: Client,
) -> None:
    """An operator confirmed a replay of two failed jobs; since then one was
    replayed, ran again and failed again (another failure): still failed, but not
    the job that was shown. Its lease_version moved on: it is left alone."""
    kept, changed = _fail(client, "mail", "boom"), _fail(client, "mail", "boom")
    shown = [client.get(kept).lease_version, client.get(changed).lease_version]
    assert client.replay(changed)
    (claim,) = client.claim("mail")
    client.fail(claim, "a different failure")
    assert client.get(changed).status is JobStatus.FAILED
    replayed = client.replay_many(
        [kept, changed], only_failed=True, lease_versions=shown, actor="dashboard:alice"
    )
    assert replayed == [kept]
    assert client.get(changed).status is JobStatus.FAILED
    assert client.get(changed).last_error == "a different failure"
    assert client.get(kept).status is JobStatus.QUEUED
    for bad in ([1], [shown[0], -1], [shown[0], True]):
        with pytest.raises(leaseq.InvalidArgument):
            client.replay_many([kept, changed], lease_versions=bad)  # type: ignore[arg-type]


def test_cancel_only_failed_skips_a_failed_job_and_nothing_else(client: Client) -> None:
    """A skip that comes after someone replayed the job leaves the replay alone."""
    failed, second = _fail(client, "mail", "boom"), _fail(client, "mail", "boom")
    queued = client.enqueue("mail", {})
    assert not client.cancel(queued, only_failed=True)
    assert client.get(queued).status is JobStatus.QUEUED
    assert client.replay(failed)  # replayed before the skip arrives
    assert not client.cancel(failed, only_failed=True)
    assert client.get(failed).status is JobStatus.QUEUED
    assert client.cancel(second, only_failed=True)
    assert client.get(second).status is JobStatus.CANCELLED
    with pytest.raises(leaseq.InvalidArgument):
        client.cancel(second, only_failed=1)  # type: ignore[arg-type]


def test_cancel_with_a_lease_version_leaves_a_job_that_changed_since_alone(
    client: Client,
) -> None:
    """A skip clicked on a page that showed a failure: since then the job was
    replayed, ran and failed again (another failure, its lease_version moved on).
    ``lease_version`` (as seen) leaves it failed, checked on the locked row."""
    job_id = _fail(client, "mail", "first failure")
    shown = client.get(job_id).lease_version
    assert client.replay(job_id)
    (claim,) = client.claim("mail")
    client.fail(claim, "second failure")
    assert not client.cancel(job_id, only_failed=True, lease_version=shown)
    job = client.get(job_id)
    assert (job.status, job.last_error) == (JobStatus.FAILED, "second failure")
    assert not [e for e in client.audit_log() if e.action == "cancel"]
    assert client.cancel(job_id, only_failed=True, lease_version=job.lease_version)
    assert client.get(job_id).status is JobStatus.CANCELLED
    # A running job's claim: only the run that was seen.
    running = client.enqueue("mail", {})
    (claim,) = client.claim("mail")
    assert not client.cancel(running, running=True, lease_version=claim.lease_version - 1)
    assert client.cancel(running, running=True, lease_version=claim.lease_version)
    for bad in (-1, True, "1", 2**63):
        with pytest.raises(leaseq.InvalidArgument):
            client.cancel(running, lease_version=bad)  # type: ignore[arg-type]


def test_get_names_the_failed_job_that_holds_a_queued_job_back(client: Client) -> None:
    """``Job.blocked_by``: under the ``block`` policy (a queue's default), a queued
    job behind its key's earliest failed job waits for an operator to replay or
    skip that job; ``ahead`` counts unfinished jobs only, so it said 0."""
    failed = _fail(client, "mail", "boom", key="k", seq=2)
    before, behind = client.enqueue_many("mail", [{"n": 1}, {"n": 3}], key="k", seqs=[1, 3])
    assert (client.get(behind).blocked_by, client.get(behind).ahead) == (failed, 1)
    assert client.get(before).blocked_by is None  # it comes first: it runs
    assert client.get(failed).blocked_by is None
    client.configure_queue("mail", ordering_policy="continue")
    assert client.get(behind).blocked_by is None
    client.configure_queue("mail", ordering_policy="block")
    assert client.get(behind).blocked_by == failed
    assert client.cancel(failed, only_failed=True)  # skipped: the key moves on
    assert client.get(behind).blocked_by is None


def test_replay_never_restarts_a_running_job(client: Client) -> None:
    job_id = client.enqueue("mail", {})
    (claim,) = client.claim("mail")
    assert not client.replay(job_id)
    client.complete(claim)  # the running attempt still owns the job


def test_cancel_running_ends_the_claim_through_the_fence(client: Client, clock: Clock) -> None:
    job_id = client.enqueue("mail", {"n": 1})
    (claim,) = client.claim("mail", lease=60)
    assert not client.cancel(job_id)  # without running=True a running job is left alone
    assert client.cancel(job_id, running=True, actor="dashboard:alice")
    job = client.get(job_id)
    assert job.status is JobStatus.CANCELLED
    assert job.lease_version > claim.lease_version
    assert job.history[-1]["outcome"] == "cancelled"
    assert job.history[-1]["previous_status"] == "running"
    # Whatever the old claim reports afterwards is refused.
    with pytest.raises(LeaseLost):
        client.renew(claim)
    with pytest.raises(LeaseLost):
        client.complete(claim)
    with pytest.raises(LeaseLost):
        client.retry(claim)
    assert client.renew_many([claim]) == [(claim, None)]
    assert client.get(job_id).status is JobStatus.CANCELLED
    # A replay waits until the lease the cancel cut short would have ended, so it
    # never starts beside an old run that has not noticed yet.
    assert client.replay(job_id)
    assert client.claim("mail") == []
    clock.advance(61)
    (again,) = client.claim("mail")
    assert again.job_id == job_id
    assert again.lease_version > job.lease_version


def test_a_replay_cancelled_and_replayed_again_still_waits_for_the_cut_lease(
    client: Client, clock: Clock
) -> None:
    """The replay's own cancel (of a queued job) cuts no lease: the wait for the
    one an earlier cancel cut short must not be forgotten."""
    job_id = client.enqueue("mail", {})
    client.claim("mail", lease=600)
    assert client.cancel(job_id, running=True)
    assert client.replay(job_id)
    assert client.cancel(job_id)  # queued now: cancelled at once
    assert client.replay(job_id)
    assert client.claim("mail") == []  # its old run may still be going
    clock.advance(601)
    (again,) = client.claim("mail")
    assert again.job_id == job_id


def test_a_released_job_whose_handler_runs_on_cancelled_and_replayed_still_waits(
    client: Client, clock: Clock
) -> None:
    """A release while the handler runs on (a stop, a thread that cannot be
    stopped) queues the job for when its lease would have ended; a cancel of the
    queued job and a replay put it back at once, beside the handler still
    running: the release's entry kept no end for the replay to wait for."""
    job_id = client.enqueue("mail", {})
    (claim,) = client.claim("mail", lease=300)
    client.release_many([claim], handlers_running=[True])
    assert client.claim("mail") == []
    assert client.cancel(job_id)  # queued: cancelled at once
    assert client.replay(job_id)
    assert client.claim("mail") == []  # its first run may still be going
    clock.advance(301)
    (again,) = client.claim("mail")
    assert again.job_id == job_id


def test_a_cancel_that_waited_for_a_claim_to_commit_tells_its_worker(
    queue: leaseq.Queue, connect: Any
) -> None:
    """The job was queued when the cancel began and running when it got the row:
    it is a running job's cancel all the same (its worker told at once, the audit
    saying so), not a queued one's."""
    job_id = queue.enqueue("mail", {})
    listener = connect(autocommit=True)  # from here: the enqueue's own wake-up is not heard
    listener.execute(f'LISTEN "{queue._store.channel}"')
    claimer = connect()  # a claim on its way: done, not committed yet
    queue._db.run_steps(_steps.claim(queue._store, "mail", limit=1, lease=60), claimer)
    cancelling = threading.Thread(target=queue.cancel, args=(job_id,), kwargs={"running": True})
    cancelling.start()
    watcher = connect(autocommit=True)
    while not watcher.execute(
        "SELECT 1 FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE '%%cancel%%'"
    ).fetchone():
        assert cancelling.is_alive()
        time.sleep(0.01)
    claimer.commit()
    cancelling.join(30)
    job = queue.get(job_id)
    assert job.status is JobStatus.CANCELLED
    assert job.history[-1]["previous_status"] == "running"
    (entry,) = [e for e in queue.audit_log() if e.action == "cancel"]
    assert entry.detail["previous_status"] == "running"
    heard = [n.payload for n in listener.notifies(timeout=5, stop_after=1)]
    assert heard == [f"!lost {job_id}"]


def test_cancel_running_keyed_job_lets_the_key_move_on(client: Client, clock: Clock) -> None:
    """Once the cancelled claim's lease would have ended: until then its handler may
    still run (its worker not told yet), and two jobs of a key never run at once."""
    first = client.enqueue("mail", {}, key="user:1")
    second = client.enqueue("mail", {}, key="user:1")
    (claim,) = client.claim("mail", limit=2, lease=30)
    assert claim.job_id == first
    assert client.cancel(first, running=True)
    assert client.claim("mail", limit=2) == []
    clock.advance(31)
    (nxt,) = client.claim("mail", limit=2)
    assert nxt.job_id == second


def test_statement_timeout_is_a_typed_error(database_url: str, schema: str) -> None:
    # The schema first, without the timeout: on a loaded CI machine one migration's
    # DDL once took longer than the 0.5 s this test gives a statement.
    with leaseq.Queue(database_url, schema=schema) as setup:
        setup.migrate()
    # 0.5 s: the stats below, the first on a fresh connection of a loaded CI
    # machine, once took more than the 50 ms this test had given it.
    with leaseq.Queue(database_url, schema=schema, statement_timeout=0.5) as queue:
        # (errors of your own SQL on connection() come out as leaseq's too)
        with pytest.raises(leaseq.StatementTimeout), queue.connection() as conn:
            conn.execute("SELECT pg_sleep(3)")
        assert queue.stats() == []  # the pool's connection works after its cancel
    with pytest.raises(leaseq.InvalidArgument):
        leaseq.Queue(database_url, schema=schema, statement_timeout=-1)


def test_the_cli_cancels_a_running_job_and_shows_the_audit_log(
    queue: leaseq.Queue, database_url: str, schema: str
) -> None:
    from click.testing import CliRunner

    from leaseq._cli import cli

    job_id = queue.enqueue("mail", {})
    queue.claim("mail")
    args = ["--database-url", database_url, "--schema", schema]
    refused = CliRunner().invoke(cli, ["cancel", str(job_id), *args])
    assert refused.exit_code == 1
    assert "running" in refused.output
    done = CliRunner().invoke(cli, ["cancel", "--running", str(job_id), *args])
    assert done.exit_code == 0, done.output
    assert queue.get(job_id).status is JobStatus.CANCELLED
    shown = CliRunner().invoke(cli, ["audit", "--json", *args])
    assert shown.exit_code == 0, shown.output
    (entry,) = json.loads(shown.output)
    assert entry["action"] == "cancel"
    assert entry["job_ids"] == [job_id]
    assert entry["actor"].startswith("cli:")


def test_failed_groups_read_only_the_newest_failures_of_a_queue(client: Client) -> None:
    ids = client.enqueue_many("mail", [{"n": n} for n in range(1005)], max_attempts=1)
    claims = client.claim("mail", limit=1005)
    assert len(claims) == len(ids)
    client.fail_many(claims, ["boom"] * len(claims))
    summary = client.failed_groups()
    assert summary.capped
    assert summary.scanned == 500
    (group,) = summary.groups
    assert group.count == 500
    assert group.newest_job_id == max(ids)


def test_a_backoff_cap_below_the_stored_base_is_refused_in_plain_words(client: Client) -> None:
    client.configure_queue("mail", backoff_base=10, backoff_cap=60)
    with pytest.raises(leaseq.InvalidArgument, match="backoff_cap must be >= backoff_base"):
        client.configure_queue("mail", backoff_cap=5)
    settings = client.queue_settings("mail")
    assert settings is not None
    assert settings.backoff_cap == 60


def test_running_jobs_lists_expired_leases_first_whatever_their_age(
    client: Client, clock: Clock
) -> None:
    first = client.enqueue("mail", {})
    client.claim("mail", lease=10)
    client.enqueue_many("mail", [{}] * 30)  # newer jobs: the old running one is past a window
    second = client.enqueue("reports", {})
    client.claim("reports", lease=600)
    clock.advance(11)
    running = client.running_jobs()
    assert [j.job_id for j in running] == [first, second]
    assert running[0].lease_remaining is not None
    assert running[0].lease_remaining < 0  # expired: waiting for recovery
    assert [j.job_id for j in client.running_jobs("reports")] == [second]
    assert [j.job_id for j in client.find_jobs(status="running", window=10).jobs] == [second]
