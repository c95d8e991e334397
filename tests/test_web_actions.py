"""Every dashboard action, its effect read back through the library, and its
audit row; a running job is never retried."""

from __future__ import annotations

import asyncio
import dataclasses
import re
from datetime import timedelta
from html import unescape

import pytest

import leaseq
from leaseq import JobStatus

from .test_web_fixtures import AppFactory, Browser, Jobs, browser, jobs, make_app, text_of

__all__ = ["browser", "jobs", "make_app"]  # fixtures, used by name


def _audit(queue: leaseq.Queue) -> list[leaseq.AuditEntry]:
    return [e for e in queue.audit_log() if e.actor.startswith("dashboard:")]


async def test_replay_a_failed_job(browser: Browser, jobs: Jobs, queue: leaseq.Queue) -> None:
    job_id = jobs.failed[0]
    page = await browser.follow(await browser.post(f"/jobs/{job_id}/replay"))
    assert f"Job {job_id} replayed" in text_of(page.text)
    assert queue.get(job_id).status is JobStatus.QUEUED
    (entry,) = _audit(queue)
    assert (entry.actor, entry.job_ids) == ("dashboard:local", (job_id,))
    # The message shows once.
    assert (
        "replayed" not in text_of((await browser.get(f"/jobs/{job_id}")).text).split("History")[0]
    )


async def test_a_running_job_is_never_replayed(
    browser: Browser, jobs: Jobs, queue: leaseq.Queue
) -> None:
    page = await browser.follow(await browser.post(f"/jobs/{jobs.running}/replay"))
    assert "would start a second run" in text_of(page.text)
    job = queue.get(jobs.running)
    assert (job.status, job.lease_version) == (JobStatus.RUNNING, jobs.running_claim.lease_version)
    queue.complete(jobs.running_claim)  # the one run still owns it


async def test_cancel_a_queued_job(browser: Browser, jobs: Jobs, queue: leaseq.Queue) -> None:
    page = await browser.follow(await browser.post(f"/jobs/{jobs.queued}/cancel"))
    assert f"Job {jobs.queued} cancelled" in text_of(page.text)
    assert queue.get(jobs.queued).status is JobStatus.CANCELLED
    again = await browser.follow(await browser.post(f"/jobs/{jobs.queued}/cancel"))
    assert "is cancelled: nothing to cancel" in text_of(again.text)


async def test_cancel_a_running_job_through_the_fence(
    browser: Browser, jobs: Jobs, queue: leaseq.Queue
) -> None:
    plain = await browser.follow(await browser.post(f"/jobs/{jobs.running}/cancel"))
    assert "is running: use “Cancel running job”" in text_of(plain.text)
    assert queue.get(jobs.running).status is JobStatus.RUNNING

    response = await browser.post(
        f"/jobs/{jobs.running}/cancel", {"running": "1", "next": "/running"}
    )
    assert response.headers["location"] == "/running"
    page = await browser.follow(response)
    assert "Its worker is told to stop" in text_of(page.text)
    assert queue.get(jobs.running).status is JobStatus.CANCELLED
    with pytest.raises(leaseq.LeaseLost):
        queue.complete(jobs.running_claim)  # the old claim's late report is refused
    assert queue.get(jobs.running).status is JobStatus.CANCELLED
    assert [e.action for e in _audit(queue)] == ["cancel"]


async def test_skip_a_blocked_head(browser: Browser, jobs: Jobs, queue: leaseq.Queue) -> None:
    assert queue.claim("emails") == []  # the key is blocked by its failed head
    page = await browser.follow(await browser.post(f"/jobs/{jobs.blocked_head}/skip"))
    assert "Skipped job" in text_of(page.text)
    assert "No blocked keys" in text_of(page.text)  # back on the Blocked keys page
    assert queue.get(jobs.blocked_head).status is JobStatus.CANCELLED
    (claim,) = queue.claim("emails")
    assert claim.job_id == jobs.blocked_waiting[0]
    not_failed = await browser.follow(await browser.post(f"/jobs/{jobs.queued}/skip"))
    assert "not a failed head" in text_of(not_failed.text)
    assert queue.get(jobs.queued).status is JobStatus.QUEUED
    # A failed job without a key (a hand-made request: the page offers no Skip
    # there) was said to be "the head of key None".
    unkeyed = await browser.follow(await browser.post(f"/jobs/{jobs.failed[0]}/skip"))
    assert "key None" not in text_of(unkeyed.text)
    assert "no ordering key" in text_of(unkeyed.text)


async def test_bulk_replay_confirms_the_count_then_replays_those(
    browser: Browser, jobs: Jobs, queue: leaseq.Queue
) -> None:
    confirm = await browser.post("/replay", {"queue": "reports", "error": "template missing"})
    assert confirm.status_code == 200
    assert "Replay 2 failed jobs?" in text_of(confirm.text)
    assert all(queue.get(i).status is JobStatus.FAILED for i in jobs.failed)  # not yet
    ids = re.search(r'name="ids" value="([^"]+)"', confirm.text)
    assert ids is not None
    assert sorted(int(i) for i in ids[1].split(",")) == sorted(jobs.failed[:2])
    done = await browser.post("/replay/confirm", {"ids": ids[1], "next": "/failed"})
    page = await browser.follow(done)
    assert "Replayed 2 of 2 jobs." in text_of(page.text)
    assert [queue.get(i).status for i in jobs.failed] == [
        JobStatus.QUEUED,
        JobStatus.QUEUED,
        JobStatus.FAILED,
    ]
    (entry,) = _audit(queue)
    assert sorted(entry.job_ids) == sorted(jobs.failed[:2])
    # Confirming again replays nothing: those jobs changed meanwhile.
    again = await browser.follow(await browser.post("/replay/confirm", {"ids": ids[1]}))
    assert "Replayed 0 of 2 jobs (2 had changed meanwhile" in text_of(again.text)


async def test_bulk_replay_is_capped(make_app: AppFactory, jobs: Jobs, queue: leaseq.Queue) -> None:
    client = Browser(make_app(bulk_limit=2))
    try:
        confirm = await client.post("/replay", {"queue": "reports"})
        page = text_of(confirm.text)
        assert "Replay 2 failed jobs?" in page
        assert "More failed jobs match" in page
        too_many = ",".join(str(i) for i in jobs.failed)
        refused = await client.post("/replay/confirm", {"ids": too_many})
        assert refused.status_code == 400
        assert all(queue.get(i).status is JobStatus.FAILED for i in jobs.failed)
    finally:
        await client.close()


async def test_pause_and_resume(browser: Browser, jobs: Jobs, queue: leaseq.Queue) -> None:
    page = await browser.follow(await browser.post("/queues/reports/pause"))
    assert "Queue reports paused" in text_of(page.text)
    settings = queue.queue_settings("reports")
    assert settings is not None
    assert settings.paused
    assert queue.claim("reports") == []
    await browser.follow(await browser.post("/queues/reports/resume", {"next": "/"}))
    settings = queue.queue_settings("reports")
    assert settings is not None
    assert not settings.paused
    assert [e.action for e in reversed(_audit(queue))] == ["pause", "resume"]
    missing = await browser.post("/queues/nope/pause")
    assert missing.status_code == 404


async def test_change_settings(browser: Browser, jobs: Jobs, queue: leaseq.Queue) -> None:
    response = await browser.post(
        "/queues/reports/settings",
        {"lease": "2m", "retain_done": "never", "max_queued_jobs": "500", "max_attempts": "20"},
    )
    page = text_of((await browser.follow(response)).text)
    assert (
        "Saved reports: lease 1m → 2m, max_queued_jobs no limit → 500, retain_done 1d → never"
        in page
    )
    settings = queue.queue_settings("reports")
    assert settings is not None
    assert (settings.lease, settings.retain_done, settings.max_queued_jobs) == (120.0, None, 500)
    unchanged = await browser.follow(
        await browser.post("/queues/reports/settings", {"lease": "120"})
    )
    assert "Nothing changed." in text_of(unchanged.text)
    cleared = await browser.post("/queues/reports/settings", {"max_queued_jobs": ""})
    await browser.follow(cleared)
    settings = queue.queue_settings("reports")
    assert settings is not None
    assert settings.max_queued_jobs is None


async def test_change_limits(browser: Browser, jobs: Jobs, queue: leaseq.Queue) -> None:
    response = await browser.post(
        "/queues/reports/settings",
        {"max_running": "5", "rate_limit": "50/1s", "rate_limit_per_group": "1000/1h"},
    )
    page = text_of((await browser.follow(response)).text)
    assert "max_running no limit → 5" in page
    assert "rate_limit no limit → 50/1s" in page
    assert "rate_limit_per_group no limit → 1000/1h" in page
    settings = queue.queue_settings("reports")
    assert settings is not None
    assert (settings.max_running, settings.rate_limit) == (5, (50, 1.0))
    assert settings.rate_limit_per_group == (1000, 3600.0)
    form = (await browser.get("/queues/reports")).text
    assert 'name="rate_limit" value="50/1s"' in form
    await browser.follow(await browser.post("/queues/reports/settings", {"rate_limit": ""}))
    settings = queue.queue_settings("reports")
    assert settings is not None
    assert settings.rate_limit is None


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("max_attempts", "abc", "max_attempts: 'abc' is not a whole number"),
        ("max_attempts", "0", "max_attempts must be an integer in [1, 1000]"),
        ("lease", "soon", "lease: 'soon' is not a duration"),
        ("backoff_cap", "0.5", "backoff_cap must be >= backoff_base"),
        ("rate_limit", "fast", "rate_limit: 'fast' is not STARTS/DURATION"),
        ("max_running", "0", "max_running must be an integer in [1, 1000000]"),
        # Only ASCII digits: int() refuses '²' and reads '٣' (Arabic-Indic) as 3.
        ("rate_limit", "²/1s", "rate_limit: '²/1s' is not STARTS/DURATION"),
        ("max_attempts", "٣", "max_attempts: '٣' is not a whole number"),
        ("lease", "٣m", "lease: '٣m' is not a duration"),
    ],
)
async def test_bad_settings_are_refused_and_nothing_is_written(  # noqa: PLR0917
    browser: Browser, jobs: Jobs, queue: leaseq.Queue, field: str, value: str, message: str
) -> None:
    before = queue.queue_settings("reports")
    # Another field changed beside it: nothing of the form is saved.
    response = await browser.post("/queues/reports/settings", {"retain_done": "5m", field: value})
    assert response.status_code == 400
    page = text_of(response.text)
    assert message in page
    assert f'value="{value}"' in response.text  # the form keeps what was typed
    assert queue.queue_settings("reports") == before
    assert _audit(queue) == []


def _failed(queue: leaseq.Queue, count: int, error: str | None) -> list[int]:
    """``count`` jobs of queue ``work`` that failed with ``error``."""
    ids = queue.enqueue_many("work", [{"n": n} for n in range(count)], max_attempts=1)
    for claim in queue.claim("work", limit=count):
        queue.fail(claim, error)
    return ids


def _group_forms(page: str) -> dict[str, dict[str, str]]:
    """The Failed page's "Replay these…" forms, by the error they show: their fields."""
    forms = {}
    for row in re.findall(r"<tr>(.*?)</tr>", page, re.S):
        shown = re.search(r'<td class="error-text">(.*?)</td>', row, re.S)
        form = re.search(r'<form method="post" action="/replay".*?</form>', row, re.S)
        if shown and form:
            fields = re.findall(r'<input type="hidden" name="(\w+)" value="([^"]*)"', form[0])
            forms[unescape(shown[1])] = {name: unescape(value) for name, value in fields}
    return forms


def _confirmed_ids(confirm: str) -> set[int]:
    ids = re.search(r'name="ids" value="([^"]*)"', confirm)
    assert ids is not None, confirm
    return {int(i) for i in ids[1].split(",") if i}


async def test_a_failed_groups_replay_takes_exactly_that_group(
    browser: Browser, queue: leaseq.Queue
) -> None:
    """ "Replay these…" of a Failed page's group selects that group's jobs only: not
    those whose error merely holds its text (in any case), and the group without
    an error text is those jobs, not every failed job. A group whose error spans
    lines is found as a browser sends it back (line breaks as CRLF)."""
    groups = {
        "boom": _failed(queue, 2, "boom"),
        "Disk BOOM: volume full": _failed(queue, 3, "Disk BOOM: volume full"),
        "(no error text)": _failed(queue, 1, None),
        "Traceback:\n boom": _failed(queue, 2, "Traceback:\n boom"),
    }
    forms = _group_forms((await browser.get("/failed")).text)
    assert {" ".join(shown.split()) for shown in forms} == {
        " ".join(error.split()) for error in groups
    }
    for shown, fields in forms.items():
        (error,) = [e for e in groups if " ".join(e.split()) == " ".join(shown.split())]
        sent = {**fields, "error": fields["error"].replace("\n", "\r\n")}
        confirm = await browser.post("/replay", sent)
        assert confirm.status_code == 200, shown
        assert _confirmed_ids(confirm.text) == set(groups[error]), shown
    boom = await browser.post("/replay", forms["boom"])
    await browser.follow(
        await browser.post(
            "/replay/confirm", {"ids": ",".join(map(str, _confirmed_ids(boom.text)))}
        )
    )
    assert {error: {queue.get(i).status for i in ids} for error, ids in groups.items()} == {
        "boom": {JobStatus.QUEUED},
        "Disk BOOM: volume full": {JobStatus.FAILED},
        "(no error text)": {JobStatus.FAILED},
        "Traceback:\n boom": {JobStatus.FAILED},
    }


async def test_failed_groups_that_differ_only_in_line_breaks_are_replayed_apart(
    browser: Browser, queue: leaseq.Queue
) -> None:
    """The page lists "a\r\nb" and "a\nb" as two groups of one job each, but a
    browser cannot send either text back as it is (its HTML parser reads a CR as
    LF, and it sends line breaks as CRLF): the replay of either took both."""
    crlf, lf = _failed(queue, 1, "line1\r\nline2"), _failed(queue, 1, "line1\nline2")
    page = (await browser.get("/failed")).text
    sent: list[dict[str, str]] = []
    for form in re.findall(r'<form method="post" action="/replay".*?</form>', page, re.S):
        fields = dict(re.findall(r'<input type="hidden" name="(\w+)" value="([^"]*)"', form))
        as_a_browser_reads = unescape(fields["error"]).replace("\r\n", "\n").replace("\r", "\n")
        sent.append({**fields, "error": as_a_browser_reads.replace("\n", "\r\n")})
    assert len(sent) == 2
    confirmed = [_confirmed_ids((await browser.post("/replay", fields)).text) for fields in sent]
    assert sorted(confirmed, key=min) == [set(crlf), set(lf)]


async def test_jobs_failed_with_an_empty_error_text_or_none_are_one_group(
    browser: Browser, queue: leaseq.Queue
) -> None:
    """Jobs failed with the error text '' and jobs failed without one were two
    groups of the Failed page, both shown "(no error text)", and the replay of
    either took the jobs of both (its digest and its matching read None as '')."""
    empty, none = _failed(queue, 1, ""), _failed(queue, 2, None)
    page = (await browser.get("/failed")).text
    assert re.findall(r'<td class="num">(\d+)</td>', page) == ["3"]
    (fields,) = _group_forms(page).values()
    confirm = await browser.post("/replay", fields)
    assert _confirmed_ids(confirm.text) == {*empty, *none}


async def test_a_failed_groups_jobs_link_lists_that_group_only(
    browser: Browser, queue: leaseq.Queue
) -> None:
    """docs/dashboard.md: "a link to the jobs of each group". The group without
    an error text linked to every failed job of its queue."""
    boom = _failed(queue, 2, "boom")
    _failed(queue, 1, None)
    page = (await browser.get("/failed")).text
    links = re.findall(r'href="(/jobs\?[^"]*)"[^>]*>Show jobs<', page)
    assert len(links) == 1, links  # the "boom" group's; none that would list all
    listed = (await browser.get(links[0].replace("&amp;", "&"))).text
    shown = {int(i) for i in re.findall(r'href="/jobs/(\d+)"', listed)}
    assert shown == set(boom)


async def test_a_failed_groups_replay_finds_failures_older_than_the_search_window(
    make_app: AppFactory, queue: leaseq.Queue
) -> None:
    """The Failed page counts a group's jobs however old: its "Replay these…" and
    the Jobs page's failed jobs find them too, once newer jobs of any queue fill
    the search window."""
    failed = _failed(queue, 3, "boom")
    queue.enqueue_many("other", [{"n": n} for n in range(50)])
    client = Browser(make_app(search_window=20))
    try:
        confirm = await client.post(
            "/replay", {"queue": "work", "error": "boom", "group": "1", "next": "/failed"}
        )
        assert "Replay 3 failed jobs?" in text_of(confirm.text)
        assert _confirmed_ids(confirm.text) == set(failed)
        listed = (await client.get("/jobs?queue=work&state=failed")).text
        assert all(f'href="/jobs/{job_id}"' in listed for job_id in failed)
    finally:
        await client.close()


async def test_confirming_a_bulk_replay_leaves_a_job_skipped_meanwhile_alone(
    make_app: AppFactory, jobs: Jobs, queue: leaseq.Queue
) -> None:
    """Step two replays only the confirmed jobs that are still failed: a head another
    operator skipped in between stays skipped, the others are replayed (even once
    newer jobs push them out of the search window)."""
    app = make_app(search_window=20)
    alice, bob = Browser(app), Browser(app)
    try:
        confirm = await alice.post("/replay", {"queue": "emails"})
        other = await alice.post("/replay", {"queue": "reports", "error": "template missing"})
        await bob.follow(await bob.post(f"/jobs/{jobs.blocked_head}/skip"))
        queue.enqueue_many("later", [{"n": n} for n in range(50)])
        ids = ",".join(map(str, _confirmed_ids(confirm.text) | _confirmed_ids(other.text)))
        done = await alice.follow(await alice.post("/replay/confirm", {"ids": ids}))
    finally:
        await alice.close()
        await bob.close()
    assert "Replayed 2 of 3 jobs (1 had changed meanwhile" in text_of(done.text)
    assert queue.get(jobs.blocked_head).status is JobStatus.CANCELLED
    assert [queue.get(i).status for i in jobs.failed[:2]] == [JobStatus.QUEUED] * 2


async def test_confirming_a_bulk_replay_leaves_a_job_that_ran_again_meanwhile_alone(
    browser: Browser, queue: leaseq.Queue
) -> None:
    """The confirmation listed a job of group "boom-group"; since then someone
    replayed it, it ran and failed with another error. It is failed again, but not
    the failure the operator confirmed: it is left alone, and the message says so."""
    (job_id,) = _failed(queue, 1, "boom-group")
    confirm = await browser.post(
        "/replay", {"queue": "work", "error": "boom-group", "group": "1", "next": "/failed"}
    )
    assert _confirmed_ids(confirm.text) == {job_id}
    fields = dict(re.findall(r'<input type="hidden" name="(\w+)" value="([^"]*)"', confirm.text))
    assert queue.replay(job_id, actor="someone-else")
    (claim,) = queue.claim("work")
    queue.fail(claim, "a different failure")
    done = await browser.follow(await browser.post("/replay/confirm", fields))
    assert "Replayed 0 of 1 jobs (1 had changed meanwhile and were left alone)" in text_of(
        done.text
    )
    job = queue.get(job_id)
    assert (job.status, job.last_error) == (JobStatus.FAILED, "a different failure")
    assert [e.action for e in _audit(queue)] == []


async def test_a_skip_never_undoes_a_replay_made_meanwhile(
    make_app: AppFactory, jobs: Jobs, queue: leaseq.Queue, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another operator replays the blocked head just after the skip looked at it:
    the replay stands (the job is queued, never cancelled) and the skip says so."""
    app = make_app()
    client = app.state.leaseq.client
    look = client.get
    replays: list[bool] = []

    async def look_then_someone_replays(job_id: int) -> leaseq.Job:
        job: leaseq.Job = await look(job_id)
        if not replays:
            replays.append(await asyncio.to_thread(queue.replay, job_id, actor="someone"))
        return job

    monkeypatch.setattr(client, "get", look_then_someone_replays)
    browser = Browser(app)
    try:
        page = await browser.follow(await browser.post(f"/jobs/{jobs.blocked_head}/skip"))
    finally:
        await browser.close()
    assert replays == [True]
    assert "changed meanwhile: nothing skipped" in text_of(page.text)
    job = queue.get(jobs.blocked_head)
    assert job.status is JobStatus.QUEUED
    assert job.history[-1]["outcome"] == "replayed"  # never cancelled in between


async def test_replaying_a_job_whose_unique_key_is_held_says_why(
    browser: Browser, queue: leaseq.Queue
) -> None:
    """Not an outage page: back to the job with a message; the job stays failed."""
    first = queue.enqueue("invoices", {"n": 1}, unique_key="invoice-7", max_attempts=1)
    (claim,) = queue.claim("invoices")
    queue.fail(claim, "boom")
    holder = queue.enqueue("invoices", {"n": 2}, unique_key="invoice-7")
    response = await browser.post(f"/jobs/{first}/replay")
    assert response.headers["location"] == f"/jobs/{first}"
    page = text_of((await browser.follow(response)).text)
    assert f"Job {first} not replayed" in page
    assert "holds its unique key" in page
    assert page.lower().count(f"job {first} not replayed") == 1  # said once, not twice
    assert queue.get(first).status is JobStatus.FAILED
    assert queue.get(holder).status is JobStatus.QUEUED


async def test_a_bulk_replay_says_which_jobs_a_unique_key_held_back(
    browser: Browser, queue: leaseq.Queue
) -> None:
    """A confirmed job that nobody touched, left failed because another job holds
    its unique key, was reported as one that "had changed meanwhile": the operator
    is told to look for a change that never happened, not why it stays failed."""
    held = queue.enqueue("invoices", {"n": 1}, unique_key="invoice-7", max_attempts=1)
    free = queue.enqueue("invoices", {"n": 2}, max_attempts=1)
    for claim in queue.claim("invoices", limit=2):
        queue.fail(claim, "boom")
    queue.enqueue("invoices", {"n": 3}, unique_key="invoice-7")  # holds the key now
    confirm = await browser.post("/replay", {"queue": "invoices", "next": "/failed"})
    assert _confirmed_ids(confirm.text) == {held, free}
    fields = dict(re.findall(r'<input type="hidden" name="(\w+)" value="([^"]*)"', confirm.text))
    page = text_of((await browser.follow(await browser.post("/replay/confirm", fields))).text)
    assert "Replayed 1 of 2 jobs" in page
    assert "changed meanwhile" not in page
    assert "1 not replayed: another job of their queue holds their unique key" in page
    assert queue.get(held).status is JobStatus.FAILED


def _failed_too_large(queue: leaseq.Queue, limit: str) -> tuple[int, int]:
    """A failed job whose payload its queue's ``limit`` was lowered below since, and
    a failed job of the same queue that still fits."""
    big, small = queue.enqueue_many("invoices", [{"blob": "x" * 200}, {"n": 1}], max_attempts=1)
    queue.fail_many(queue.claim("invoices", limit=2), ["boom"] * 2)
    queue.configure_queue("invoices", **{limit: 100})
    return big, small


@pytest.mark.parametrize("limit", ["max_queued_bytes", "max_payload_bytes"])
@pytest.mark.parametrize("shown", [True, False], ids=["as-shown", "plain"])
async def test_replaying_a_job_too_large_for_its_queue_now_says_why(
    browser: Browser, queue: leaseq.Queue, limit: str, shown: bool
) -> None:
    """Its payload is over a limit lowered since it was enqueued: the replay can never
    succeed, and the page must say that, not "queue full" (try later) nor "another
    job holds its unique key". Sent as the job page sends it (the version shown),
    or plain."""
    big, _ = _failed_too_large(queue, limit)
    before = queue.get(big)
    fields = {"only_failed": "1", "lease_version": str(before.lease_version)} if shown else {}
    response = await browser.post(f"/jobs/{big}/replay", fields)
    assert response.headers["location"] == f"/jobs/{big}"
    page = text_of((await browser.follow(response)).text)
    assert f"Job {big} not replayed" in page
    assert f"larger than its queue's {limit}" in page
    assert "full" not in page
    assert "unique key" not in page
    assert queue.get(big) == before


@pytest.mark.parametrize("limit", ["max_queued_bytes", "max_payload_bytes"])
async def test_a_bulk_replay_says_which_jobs_are_too_large_for_their_queue_now(
    browser: Browser, queue: leaseq.Queue, limit: str
) -> None:
    """One confirmed job too large for its queue now made the whole replay "queue
    full" (none replayed), or was reported as held by a unique key: the others are
    replayed, and the message says why that one is not."""
    big, small = _failed_too_large(queue, limit)
    confirm = await browser.post("/replay", {"queue": "invoices", "next": "/failed"})
    assert _confirmed_ids(confirm.text) == {big, small}
    fields = dict(re.findall(r'<input type="hidden" name="(\w+)" value="([^"]*)"', confirm.text))
    page = text_of((await browser.follow(await browser.post("/replay/confirm", fields))).text)
    assert "Replayed 1 of 2 jobs" in page
    assert "1 not replayed: their payload is larger than their queue's limits now" in page
    assert "unique key" not in page
    assert "changed meanwhile" not in page
    assert (queue.get(big).status, queue.get(small).status) == (
        JobStatus.FAILED,
        JobStatus.QUEUED,
    )


@pytest.mark.parametrize("ids", ["²", "٣", "0", "4,x", "99999999999999999999", "1;2"])
async def test_a_malformed_list_of_jobs_to_replay_is_refused(
    browser: Browser, jobs: Jobs, queue: leaseq.Queue, ids: str
) -> None:
    """A 400, nothing replayed: only ASCII digits make a job id ('²' is no number to
    int(), and it reads '٣' as 3)."""
    response = await browser.post("/replay/confirm", {"ids": ids})
    assert response.status_code == 400
    assert "Not done" in text_of(response.text)
    assert _audit(queue) == []


def _settings_form(page: str) -> dict[str, str]:
    """What the settings form of ``page`` submits as shown (its inputs, hidden ones
    but the form token included, and each select's chosen option)."""
    inputs = re.findall(r'<input (?:type="hidden" )?name="(\w+)" value="([^"]*)"', page)
    form = {name: unescape(value) for name, value in inputs if name != "csrf"}
    for name, options in re.findall(r'<select name="(\w+)">(.*?)</select>', page, re.S):
        (form[name],) = re.findall(r"<option selected>([^<]*)<", options)
    return form


async def test_the_settings_form_saves_back_every_value_it_shows(
    browser: Browser, queue: leaseq.Queue
) -> None:
    """Whatever a queue's settings, the form shows each in a form it reads back:
    saving one field changes that field only."""
    queue.configure_queue("odd", lease=1234.5678, retain_done=1_000_000.0, backoff_base=0.3)
    before = queue.queue_settings("odd")
    assert before is not None
    form = _settings_form((await browser.get("/queues/odd")).text)
    response = await browser.post("/queues/odd/settings", {**form, "max_attempts": "7"})
    saved = text_of((await browser.follow(response)).text)
    assert "Saved odd: max_attempts 20 → 7." in saved
    assert queue.queue_settings("odd") == dataclasses.replace(before, max_attempts=7)


async def test_a_settings_save_keeps_what_another_operator_changed_meanwhile(
    browser: Browser, queue: leaseq.Queue
) -> None:
    """Operator A opens the form; operator B changes the lease and the attempts; A
    changes only the done retention and saves. The save compared every field with
    the settings as they were then, so it put A's stale lease and attempts back,
    silently undoing B's change (and audited it as A's)."""
    queue.configure_queue("shared", lease=0.3, retain_done=90061.0)
    form = _settings_form((await browser.get("/queues/shared")).text)  # A's form
    queue.configure_queue("shared", lease=120, max_attempts=9)  # B, meanwhile
    response = await browser.post("/queues/shared/settings", {**form, "retain_done": "2h"})
    saved = text_of((await browser.follow(response)).text)
    assert "Saved shared: retain_done" in saved
    assert "lease" not in saved.split("Saved shared:", 1)[1].split(".", 1)[0]
    after = queue.queue_settings("shared")
    assert after is not None
    assert (after.lease, after.max_attempts, after.retain_done) == (120, 9, 7200)


def _declare(queue: leaseq.Queue, name: str, first_tick_in: float) -> None:
    """A schedule as a worker declares it, its first tick ``first_tick_in`` seconds
    from the database's now (negative: past due, as one no worker declares)."""
    now = queue._db.run(queue._store.clock_now())
    first = now + timedelta(seconds=first_tick_in)
    queue._db.run(queue._store.register_schedules([(name, "reports", "every 60", "UTC", first)]))


async def test_schedules_show_which_no_worker_runs_and_offer_only_those_for_removal(
    browser: Browser, queue: leaseq.Queue
) -> None:
    _declare(queue, "stale report", -7200)
    _declare(queue, "live", 3600)
    page = await browser.get("/schedules")
    assert page.status_code == 200
    rows = {row.split("</td>")[0]: row for row in page.text.split("<tr>\n    <td>")[1:]}
    assert set(rows) == {"stale report", "live"}
    assert "overdue 2h" in text_of(rows["stale report"])
    assert "overdue" not in rows["live"]
    assert 'value="stale report"' in rows["stale report"]  # its Remove form
    assert 'method="post"' not in rows["live"]  # a live one is not offered
    overview = text_of((await browser.get("/")).text)
    assert "1 schedule(s) overdue by more than a minute (stale report)" in overview

    removed = await browser.follow(
        await browser.post("/schedules/remove", {"name": "stale report"})
    )
    assert "Schedule stale report removed" in text_of(removed.text)
    assert [s.name for s in queue.schedules()] == ["live"]
    assert "overdue" not in text_of((await browser.get("/")).text)
    (entry,) = _audit(queue)
    assert (entry.action, entry.detail["schedule"]) == ("remove_schedule", "stale report")
    again = await browser.post("/schedules/remove", {"name": "stale report"})
    assert again.status_code == 404
    bad = await browser.post("/schedules/remove", {"name": ""})
    assert bad.status_code == 400
    assert [s.name for s in queue.schedules()] == ["live"]
