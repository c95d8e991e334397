"""Actions clicked on a page shown before the state changed: each acts on what
the page showed or refuses (a schedule that came back alive is not removed, a
head skipped meanwhile is not replayed, a job that failed meanwhile is not
cancelled), and the page after an action shows its effect."""

from __future__ import annotations

import asyncio
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


def _declare(queue: leaseq.Queue, name: str, first_tick_in: float) -> None:
    """A schedule as a worker declares it, its first tick ``first_tick_in`` seconds
    from the database's now (negative: past due, as one no worker declares)."""
    now = queue._db.run(queue._store.clock_now())
    first = now + timedelta(seconds=first_tick_in)
    queue._db.run(queue._store.register_schedules([(name, "reports", "every 60", "UTC", first)]))


def _form_fields(page: str, action: str) -> dict[str, str]:
    """The hidden fields of the page's (first) form posting to ``action``."""
    form = re.search(rf'<form method="post" action="{re.escape(action)}".*?</form>', page, re.S)
    assert form is not None, f"no form posting to {action}"
    fields = re.findall(r'<input type="hidden" name="(\w+)" value="([^"]*)"', form[0])
    return {name: unescape(value) for name, value in fields}


# -- Schedules: Remove ---------------------------------------------------------------


async def test_removing_a_schedule_a_running_worker_declares_is_refused(
    browser: Browser, queue: leaseq.Queue
) -> None:
    """docs/dashboard.md: only a schedule overdue by more than a minute (declared
    by no running worker) gets a Remove button. The server removed any schedule
    it was asked to: the Remove of a page loaded while the workers were down,
    clicked once they are back, removed a schedule that a running worker
    declares, which that worker then no longer ticks (until it restarts)."""
    _declare(queue, "nightly", 3600)  # declared by a running worker: not overdue
    (shown,) = queue.schedules()
    assert not shown.stalled
    response = await browser.post("/schedules/remove", {"name": "nightly"})
    assert [s.name for s in queue.schedules()] == ["nightly"], "a live schedule was removed"
    assert response.status_code in (400, 409), response.status_code
    assert "overdue" in text_of(response.text) or "running worker" in text_of(response.text)
    assert _audit(queue) == []


# -- Blocked keys: Replay head ---------------------------------------------------------


async def test_replay_head_leaves_a_head_skipped_meanwhile_alone(
    browser: Browser, jobs: Jobs, queue: leaseq.Queue
) -> None:
    """The Blocked keys page offers "Replay head" for a failed head. Another
    operator skips that head meanwhile (it becomes cancelled and the key moves
    on): the click on the page as it was shown put the skipped job back in
    front of its key (its earliest job, so the key's other jobs wait behind it
    again). The mirror case (a skip never undoes a replay made meanwhile) is
    guarded; this one was not."""
    head = jobs.blocked_head
    page = (await browser.get("/blocked")).text
    fields = _form_fields(page, f"/jobs/{head}/replay")
    # Another operator skips the head: the key moves on.
    assert queue.cancel(head, only_failed=True, actor="someone")
    response = await browser.post(f"/jobs/{head}/replay", fields)
    shown = text_of((await browser.follow(response)).text)
    assert queue.get(head).status is JobStatus.CANCELLED, "the skipped head was replayed"
    assert "replayed: it is queued again" not in shown
    assert [e.action for e in _audit(queue)] == []


async def test_replay_of_a_failed_job_page_leaves_a_job_skipped_meanwhile_alone(
    browser: Browser, jobs: Jobs, queue: leaseq.Queue
) -> None:
    """The same on the job's own page: it showed the job failed, with Replay and
    Skip; skipped by someone else since, the Replay took it back from the skip."""
    head = jobs.blocked_head
    page = (await browser.get(f"/jobs/{head}")).text
    fields = _form_fields(page, f"/jobs/{head}/replay")
    assert queue.cancel(head, only_failed=True, actor="someone")
    await browser.follow(await browser.post(f"/jobs/{head}/replay", fields))
    assert queue.get(head).status is JobStatus.CANCELLED
    # A replay of the job shown cancelled still replays it.
    page = (await browser.get(f"/jobs/{head}")).text
    fields = _form_fields(page, f"/jobs/{head}/replay")
    shown = text_of((await browser.follow(await browser.post(f"/jobs/{head}/replay", fields))).text)
    assert "replayed: it is queued again" in shown
    assert queue.get(head).status is JobStatus.QUEUED


# -- After an action, the page shows its effect ----------------------------------------------


async def test_the_page_after_an_action_shows_its_effect_despite_a_load_in_flight(
    make_app: AppFactory, jobs: Jobs, queue: leaseq.Queue, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An action clears the shared cache "so that the next page shows the action's
    effect". A load that another tab started before the action (its statement
    read the state from before) was still in flight: the page the action
    redirected to joined it, and showed the queue it had just paused as not
    paused (then kept that for cache_seconds)."""
    app = make_app(cache_seconds=60)
    browser = Browser(app)
    client = app.state.leaseq.client
    stats = client.stats
    gate = asyncio.Event()
    read_before: list[bool] = []

    async def slow_stats(name: str | None = None) -> list[leaseq.QueueStats]:
        found: list[leaseq.QueueStats] = await stats(name)
        if not read_before:  # the other tab's load: read, then slow to come back
            read_before.append(True)
            await gate.wait()
        return found

    try:
        token = await browser.token("/jobs")
        monkeypatch.setattr(client, "stats", slow_stats)
        other_tab = asyncio.create_task(browser.get("/live/overview"))
        while not read_before:
            await asyncio.sleep(0.01)
        response = await browser.post("/queues/reports/pause", {"csrf": token, "next": "/"})
        assert response.status_code == 303
        assert queue.queue_settings("reports").paused  # type: ignore[union-attr]
        after = asyncio.create_task(browser.get(response.headers["location"]))
        await asyncio.sleep(0.3)  # it has joined the load in flight, if it does
        gate.set()
        page = (await after).text
        await other_tab
    finally:
        gate.set()
        await browser.close()
    card = re.search(r'aria-label="Queue reports">(.*?)</section>', page, re.S)
    assert card is not None
    assert '<span class="badge paused">paused</span>' in card[1], "the page shows it not paused"


# -- Cancel: never a skip of a job that failed meanwhile ------------------------------------


async def test_cancel_running_job_leaves_a_job_that_failed_meanwhile_alone(
    browser: Browser, jobs: Jobs, queue: leaseq.Queue
) -> None:
    """The Running page's Cancel of a running job whose handler fails it just
    before the click: ``cancel(running=True)`` cancels failed jobs too (that is a
    skip), so the click turned the failed job, kept for investigation and replay
    (and, under the ``block`` policy, holding its key), into a cancelled one, and
    said "cancelled. Its worker is told to stop"."""
    job_id = queue.enqueue("emails", {"to": "b@example.com"}, key="cust-2", max_attempts=1)
    (claim,) = [c for c in queue.claim("emails", limit=5) if c.job_id == job_id]
    page = (await browser.get("/running")).text
    fields = _form_fields(page, f"/jobs/{job_id}/cancel")
    assert fields["running"] == "1"
    queue.fail(claim, "smtp refused")  # its handler fails it, meanwhile
    response = await browser.post(f"/jobs/{job_id}/cancel", fields)
    shown = text_of((await browser.follow(response)).text)
    assert queue.get(job_id).status is JobStatus.FAILED, "a failed job was cancelled (skipped)"
    assert "cancelled. Its worker is told to stop" not in shown
    assert [e.action for e in _audit(queue)] == []


async def test_cancel_of_a_queued_job_leaves_a_job_that_failed_meanwhile_alone(
    browser: Browser, jobs: Jobs, queue: leaseq.Queue
) -> None:
    """The same on a queued job's page: a worker takes the job and it fails
    before the Cancel click; the click skipped the failed job (and so unblocked
    its key) under the message "Job … cancelled."."""
    job_id = queue.enqueue("emails", {"to": "c@example.com"}, key="cust-3", max_attempts=1)
    page = (await browser.get(f"/jobs/{job_id}")).text
    fields = _form_fields(page, f"/jobs/{job_id}/cancel")
    (claim,) = [c for c in queue.claim("emails", limit=5) if c.job_id == job_id]
    queue.fail(claim, "smtp refused")
    response = await browser.post(f"/jobs/{job_id}/cancel", fields)
    shown = text_of((await browser.follow(response)).text)
    assert queue.get(job_id).status is JobStatus.FAILED, "a failed job was cancelled (skipped)"
    assert f"Job {job_id} cancelled" not in shown
    assert [e.action for e in _audit(queue)] == []


async def test_cancel_running_job_of_a_job_queued_again_meanwhile_says_what_it_cancelled(
    browser: Browser, queue: leaseq.Queue
) -> None:
    """The Running page's Cancel of a job whose run ended meanwhile with a retry:
    the queued job is cancelled (what the button is for: the job stops), but the
    message, worded from the form's ``running=1``, said "Its worker is told to
    stop": no worker held it."""
    queue.configure_queue("r", max_attempts=5)
    job_id = queue.enqueue("r", {})
    (claim,) = queue.claim("r")
    fields = _form_fields((await browser.get("/running")).text, f"/jobs/{job_id}/cancel")
    assert fields["running"] == "1"
    queue.retry(claim, delay=60, error="transient")  # its run ends: queued for a retry
    response = await browser.post(f"/jobs/{job_id}/cancel", fields)
    page = (await browser.follow(response)).text
    flash = re.search(r'<p class="flash"[^>]*>(.*?)</p>', page, re.S)
    assert flash is not None
    assert queue.get(job_id).status is JobStatus.CANCELLED
    assert text_of(flash[1]) == (
        f"Job {job_id} cancelled: it was queued (its run had ended), no worker held it."
    )


# -- Skip and Replay: never a failure the page did not show ---------------------------------


def _fails_again(queue: leaseq.Queue, job_id: int) -> None:
    """Someone replays the failed job, and it runs and fails again: failed, but
    another failure (its lease_version moved on)."""
    before = queue.get(job_id).lease_version
    assert queue.replay(job_id, actor="someone-else")
    (claim,) = [c for c in queue.claim("emails", limit=5) if c.job_id == job_id]
    queue.fail(claim, "second failure")
    assert queue.get(job_id).lease_version != before


@pytest.mark.parametrize(
    ("page", "action"),
    [
        ("/blocked", "skip"),
        ("/blocked", "replay"),
        ("/jobs/{head}", "skip"),
        ("/jobs/{head}", "replay"),
    ],
)
async def test_skip_and_replay_leave_a_head_that_failed_again_since_alone(
    browser: Browser, jobs: Jobs, queue: leaseq.Queue, page: str, action: str
) -> None:
    """Skip (Blocked keys page, job page) and Replay of a failed head checked only
    that it is failed: one replayed since the page was shown, which ran and failed
    again, was skipped (or replayed), a failure the operator never saw. The bulk
    replay refuses exactly this (its lease_versions); these now do too, on the
    locked row."""
    head = jobs.blocked_head
    shown = (await browser.get(page.format(head=head))).text
    assert "smtp refused" in shown
    fields = _form_fields(shown, f"/jobs/{head}/{action}")
    _fails_again(queue, head)
    response = await browser.post(f"/jobs/{head}/{action}", fields)
    flash = re.search(r'<p class="flash"[^>]*>(.*?)</p>', (await browser.follow(response)).text)
    assert flash is not None
    job = queue.get(head)
    assert (job.status, job.last_error) == (JobStatus.FAILED, "second failure")
    assert f"Job {head} changed meanwhile" in text_of(flash[1])
    assert [e.action for e in _audit(queue)] == []
    # Shown again, the failure as it is now: the same click does it.
    fields = _form_fields(
        (await browser.get(page.format(head=head))).text, f"/jobs/{head}/{action}"
    )
    await browser.follow(await browser.post(f"/jobs/{head}/{action}", fields))
    expected = JobStatus.CANCELLED if action == "skip" else JobStatus.QUEUED
    assert queue.get(head).status is expected


async def test_a_malformed_lease_version_is_refused(
    browser: Browser, jobs: Jobs, queue: leaseq.Queue
) -> None:
    head = jobs.blocked_head
    for action in ("skip", "replay"):
        for bad in ("-1", "x", "1.0", "9" * 30):
            response = await browser.post(f"/jobs/{head}/{action}", {"lease_version": bad})
            assert response.status_code == 400, (action, bad)
    assert queue.get(head).status is JobStatus.FAILED
    assert _audit(queue) == []
