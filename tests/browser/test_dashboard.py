"""The dashboard in a real browser: Debian's Chromium driven by Playwright, against
the real app on a real database, with real worker processes where a job must run.

Screenshots go to test-artifacts/screenshots/ for a reviewer.
"""

from __future__ import annotations

import math
import re
import time
from datetime import timedelta
from typing import Any

import pytest

import leaseq
from leaseq import JobStatus
from leaseq.testing import set_clock_offset

from .harness import Served, Workers, screenshot, wait_for

pytestmark = pytest.mark.slow


def _markers(queue: leaseq.Queue, job_id: int) -> list[tuple[int, str, str | None]]:
    """(attempt, what, detail) the worker app's handlers wrote for the job, in order."""
    with queue.connection() as conn:
        rows = conn.execute(
            f'SELECT attempt, what, detail FROM "{queue.schema}".marker'
            " WHERE job_id = %s ORDER BY at",
            (job_id,),
        ).fetchall()
    return [(int(a), str(w), d) for a, w, d in rows]


def _effects(queue: leaseq.Queue) -> int:
    with queue.connection() as conn:
        row = conn.execute(f'SELECT count(*) FROM "{queue.schema}".effect').fetchone()
    assert row is not None
    return int(row[0])


def _state(page: Any) -> str:
    return str(page.locator("#job-live .state").first.inner_text()).strip()


def _failed_jobs(queue: leaseq.Queue, errors: list[str], name: str = "reports") -> list[int]:
    """One failed job per error text, in order."""
    ids = queue.enqueue_many(
        name, [{"customer": f"c{n}", "n": n} for n in range(len(errors))], max_attempts=1
    )
    claims = {c.job_id: c for c in queue.claim(name, limit=len(ids), lease=60)}
    for job_id, error in zip(ids, errors, strict=True):
        queue.fail(claims[job_id], error)
    return ids


def _populate_overview(queue: leaseq.Queue) -> None:
    """Two queues with work in every state, a busy minute of done jobs and some failed."""
    done = queue.enqueue_many("reports", [{"customer": f"c{n}"} for n in range(24)])
    for claim in queue.claim("reports", limit=len(done), lease=60):
        queue.complete(claim)
    _failed_jobs(queue, ["template missing"] * 3 + ["warehouse timed out"])
    queue.enqueue_many("reports", [{"customer": f"q{n}"} for n in range(5)])
    (running,) = queue.claim("reports", lease=300)
    assert running.job_id
    queue.configure_queue("emails", max_queued_jobs=50, ordering_policy="block")
    sent = queue.enqueue_many("emails", [{"to": f"u{n}@example.com"} for n in range(8)])
    for claim in queue.claim("emails", limit=len(sent) - 2, lease=60):
        queue.complete(claim)
    # A key held by its failed head, two jobs waiting behind it.
    mails = [{"to": "ops@example.com", "n": n} for n in range(3)]
    head, *_ = queue.enqueue_many("emails", mails, key="cust-7", seqs=[1, 2, 3])
    claims = queue.claim("emails", limit=10, lease=60)
    for claim in claims:
        if claim.job_id == head:
            queue.fail(claim, "smtp refused: mailbox full")
        else:
            queue.release_many([claim])


def test_overview(page: Any, dashboard: Served, tables: leaseq.Queue) -> None:
    queue = tables
    _populate_overview(queue)
    page.goto(f"{dashboard.url}/")
    reports = page.locator("section[aria-label='Queue reports']")
    reports.wait_for()
    assert page.title().startswith("Overview")
    assert reports.locator(".count-done .n").inner_text().strip() == "24"
    assert reports.locator(".count-failed .n").inner_text().strip() == "4"
    assert reports.locator(".count-running .n").inner_text().strip() == "1"
    assert reports.locator("svg[role='img']").count() == 1  # the last hour's chart
    assert "24 done" in reports.locator("figcaption").inner_text()
    emails = page.locator("section[aria-label='Queue emails']")
    assert emails.locator("meter").count() == 1  # its admission limit, and how full it is
    screenshot(page, "overview")
    # Pause a queue with a click, then resume it (both audited).
    reports.get_by_role("button", name="Pause").click()
    page.wait_for_url(f"{dashboard.url}/")
    assert reports.locator(".badge.paused").count() == 1
    assert queue.queue_settings("reports").paused
    screenshot(page, "overview-paused")
    reports.get_by_role("button", name="Resume").click()
    page.wait_for_url(f"{dashboard.url}/")
    assert reports.locator(".badge.paused").count() == 0
    assert not queue.queue_settings("reports").paused
    # Two schedules as workers declare them: one no running worker declares any more
    # (its tick long past due), one ticking.
    now = queue._db.run(queue._store.clock_now())
    queue._db.run(
        queue._store.register_schedules(
            [
                ("old-digest", "emails", "cron 0 7 * * *", "UTC", now - timedelta(hours=5)),
                ("nightly-report", "reports", "every 86400", "UTC", now + timedelta(hours=3)),
            ]
        )
    )
    # The navigation reaches every page.
    for label, heading, shot in [
        ("Jobs", "Jobs", "jobs"),
        ("Running", "Running jobs", None),
        ("Failed", "Failed jobs by error", None),
        ("Blocked keys", "Blocked ordering keys", "blocked"),
        ("Schedules", "Schedules", "schedules"),
        ("Audit", "Audit log", "audit"),
    ]:
        page.get_by_role("navigation").get_by_role("link", name=label, exact=True).click()
        assert page.get_by_role("heading", level=1).inner_text().strip() == heading
        assert page.locator(f"nav a[aria-current='page']:text-is('{label}')").count() == 1
        if shot:
            screenshot(page, shot)
    newest = queue.audit_log(limit=2)
    assert [(e.action, e.actor.split(":")[0]) for e in newest] == [
        ("resume", "dashboard"),
        ("pause", "dashboard"),
    ]
    blocked = page.goto(f"{dashboard.url}/blocked")
    assert blocked is not None
    row = page.locator("tr", has_text="cust-7")
    assert row.locator("td.num").inner_text().strip() == "2"  # waiting behind the head
    head_id = int(row.get_by_role("link", name=re.compile(r"^#\d+$")).inner_text()[1:])
    row.get_by_role("button", name="Skip head").click()  # the key moves on
    page.wait_for_url(re.compile(r"/blocked$"))
    assert "No blocked keys" in page.locator("main").inner_text()
    assert queue.get(head_id).status is JobStatus.CANCELLED
    claimed = queue.claim("emails", limit=10, lease=60)
    assert [c.seq for c in claimed if c.key == "cust-7"] == [2]  # the next of the key
    page.goto(f"{dashboard.url}/queues/emails")
    screenshot(page, "queue-settings")


def test_replay_a_failed_job_from_the_failed_page(
    page: Any, dashboard: Served, tables: leaseq.Queue
) -> None:
    queue = tables
    first, newest = _failed_jobs(queue, ["template 'broken' is missing"] * 2)
    (other,) = _failed_jobs(queue, ["customer not found"])
    page.goto(f"{dashboard.url}/failed")
    row = page.locator("tr", has_text="template 'broken' is missing")
    assert row.locator("td.num").inner_text().strip() == "2"  # grouped by error, counted
    assert page.locator("tr", has_text="customer not found").locator("td.num").inner_text() == "1"
    screenshot(page, "failed")
    row.get_by_role("link", name=f"#{newest}").click()  # the group's newest job
    page.wait_for_url(re.compile(rf"/jobs/{newest}$"))
    assert _state(page) == "failed"
    assert "template 'broken' is missing" in page.locator("pre.error-text").first.inner_text()
    screenshot(page, "job-failed-before-replay")
    page.get_by_role("button", name="Replay", exact=True).click()
    page.wait_for_url(re.compile(rf"/jobs/{newest}$"))
    assert "replayed" in page.get_by_role("status").inner_text()
    assert _state(page) == "queued"
    assert page.get_by_role("button", name="Replay", exact=True).count() == 0
    assert "replayed" in page.locator("ol.timeline").inner_text()
    screenshot(page, "job-after-replay")
    # The database agrees: only that job moved, with an audit row saying who did it.
    assert queue.get(newest).status is JobStatus.QUEUED
    assert queue.get(first).status is JobStatus.FAILED
    assert queue.get(other).status is JobStatus.FAILED
    (entry,) = queue.audit_log()
    assert (entry.action, entry.job_ids) == ("replay", (newest,))
    assert entry.actor.startswith("dashboard:")


def test_bulk_replay_confirms_the_count_then_replays_them(
    page: Any, dashboard: Served, tables: leaseq.Queue
) -> None:
    queue = tables
    broken = _failed_jobs(queue, ["template missing"] * 3)
    (other,) = _failed_jobs(queue, ["customer not found"])
    page.goto(f"{dashboard.url}/failed")
    row = page.locator("tr", has_text="template missing")
    row.get_by_role("button", name="Replay these…").click()
    heading = page.get_by_role("heading", level=1)
    assert heading.inner_text().strip() == "Replay 3 failed jobs?"
    screenshot(page, "bulk-replay-confirm")
    # Nothing happened yet: the confirmation only counted.
    assert {queue.get(i).status for i in broken} == {JobStatus.FAILED}
    page.get_by_role("button", name="Replay 3 jobs").click()
    page.wait_for_url(re.compile(r"/failed$"))
    assert "3" in page.get_by_role("status").inner_text()
    screenshot(page, "bulk-replay-done")
    assert {queue.get(i).status for i in broken} == {JobStatus.QUEUED}
    assert queue.get(other).status is JobStatus.FAILED  # another error: not matched
    (entry,) = queue.audit_log()
    assert sorted(entry.job_ids) == sorted(broken)
    # The Failed page now shows only the other group.
    assert page.locator("tr", has_text="template missing").count() == 0
    assert page.locator("tr", has_text="customer not found").count() == 1


def test_bulk_replay_from_a_jobs_filter(page: Any, dashboard: Served, tables: leaseq.Queue) -> None:
    queue = tables
    ids = _failed_jobs(queue, ["timeout", "timeout", "timeout"])  # payloads c0, c1, c2
    page.goto(f"{dashboard.url}/jobs?state=failed&payload=customer:c1")
    assert page.locator("table.jobs tbody tr").count() == 1
    page.get_by_role("button", name="Replay failed jobs matching this filter…").click()
    assert page.get_by_role("heading", level=1).inner_text().strip() == "Replay 1 failed job?"
    page.get_by_role("button", name="Replay 1 job").click()
    page.wait_for_url(re.compile(r"/jobs\?"))
    assert [queue.get(i).status for i in ids] == [
        JobStatus.FAILED,
        JobStatus.QUEUED,
        JobStatus.FAILED,
    ]


def test_job_page_timeline(page: Any, dashboard: Served, tables: leaseq.Queue) -> None:
    """A job with a retried attempt, a lost lease recovered, a failure, a replay by
    the dashboard, then done: its timeline tells it in order."""
    queue = tables
    job_id = queue.enqueue(
        "reports", {"customer": "acme", "period": "2026-11"}, key="acme", seq=1, max_attempts=3
    )
    (claim,) = queue.claim("reports", lease=30)
    queue.retry(claim, delay=0, error="warehouse timed out (attempt 1)")
    (claim,) = queue.claim("reports", lease=30)
    set_clock_offset(queue, 60)  # its worker vanished: the lease expires
    (claim,) = queue.claim("reports", lease=30)  # recovered by another worker
    queue.fail(claim, "report template 'broken' is missing")
    page.goto(f"{dashboard.url}/jobs/{job_id}")
    page.get_by_role("button", name="Replay", exact=True).click()
    page.wait_for_url(re.compile(rf"/jobs/{job_id}$"))
    (claim,) = queue.claim("reports", lease=30)
    queue.complete(claim)
    page.reload()
    assert _state(page) == "done"
    timeline = page.locator("ol.timeline li")
    texts = [t.strip() for t in timeline.all_inner_texts()]
    assert len(texts) >= 5, texts
    joined = "\n".join(texts)
    for expected in ("warehouse timed out", "template 'broken' is missing", "replayed"):
        assert expected in joined, joined
    assert page.locator("ol.timeline .actor", has_text="dashboard:").count() == 1
    screenshot(page, "job-timeline")


@pytest.mark.parametrize("task", ["hold", "hold_async"])
def test_cancel_a_running_job_held_by_a_real_worker(
    page: Any, dashboard: Served, tables: leaseq.Queue, workers: Workers, task: str
) -> None:
    queue = tables
    job_id = queue.enqueue(task, {"customer": "acme"})
    page.goto(f"{dashboard.url}/running")
    assert "Nothing is running" in page.locator("#running-live").inner_text()
    worker = workers.start("--concurrency", "2", "-q", task)
    wait_for(lambda: _markers(queue, job_id), what="the handler starting")
    # The page refreshes itself (htmx, every few seconds): the job shows up, no reload.
    row = page.locator("tr", has=page.get_by_role("link", name=f"#{job_id}", exact=True))
    row.wait_for(timeout=15_000)
    assert row.locator("td").nth(3).inner_text().strip() == "1"  # lease version
    screenshot(page, f"running-{task}")
    row.get_by_role("link", name=f"#{job_id}", exact=True).click()
    page.wait_for_url(re.compile(rf"/jobs/{job_id}$"))
    assert _state(page) == "running"
    assert page.get_by_role("button", name="Replay", exact=True).count() == 0  # never a 2nd run
    screenshot(page, f"job-running-{task}")
    page.get_by_role("button", name="Cancel running job").click()
    page.wait_for_url(re.compile(rf"/jobs/{job_id}$"))
    assert "cancelled" in page.get_by_role("status").inner_text()
    assert _state(page) == "cancelled"
    # The worker's handler was told and stopped; what it tried afterwards was refused.
    wait_for(lambda: len(_markers(queue, job_id)) >= 4, timeout=20, what="the handler stopping")
    markers = _markers(queue, job_id)
    assert [what for _, what, _ in markers] == ["started", "stopped", "transaction", "complete"]
    assert markers[2][2] == "refused: LeaseLost"  # job.transaction(): told locally
    assert markers[3][2] == "refused: LeaseLost"  # Queue.complete(old claim): the fence
    assert _effects(queue) == 0  # the late completion's effect rolled back
    # Nothing runs it again: past its lease and a few polls, still cancelled, one attempt.
    time.sleep(4)
    job = queue.get(job_id)
    assert job.status is JobStatus.CANCELLED
    assert job.attempts == 1
    assert job.lease_version >= 2  # the cancel moved the fence on
    assert [what for _, what, _ in _markers(queue, job_id)].count("started") == 1
    assert worker.poll() is None  # the worker lives on
    page.reload()
    assert "cancelled" in page.locator("ol.timeline").inner_text()
    screenshot(page, f"job-cancelled-{task}")
    (entry,) = queue.audit_log()
    assert entry.job_ids == (job_id,)
    assert workers.stop(worker) == 0


def test_running_page_shows_expired_leases_first(
    page: Any, dashboard: Served, tables: leaseq.Queue
) -> None:
    queue = tables
    kept, lapsing = queue.enqueue_many("reports", [{"n": 1}, {"n": 2}])
    (claim,) = queue.claim("reports", lease=600)
    assert claim.job_id == kept
    (claim,) = queue.claim("reports", lease=5)
    assert claim.job_id == lapsing
    set_clock_offset(queue, 30)  # its worker is gone: the lease lapsed 25 s ago
    page.goto(f"{dashboard.url}/running")
    rows = page.locator("#running-live tbody tr")
    assert rows.count() == 2
    first = rows.nth(0)
    assert first.get_attribute("class") == "expired"
    assert f"#{lapsing}" in first.inner_text()
    assert "waiting for recovery" in first.inner_text()
    assert f"#{kept}" in rows.nth(1).inner_text()
    screenshot(page, "running-expired")


def test_change_a_queues_settings(page: Any, dashboard: Served, tables: leaseq.Queue) -> None:
    queue = tables
    queue.enqueue("reports", {"customer": "acme"})
    page.goto(f"{dashboard.url}/")
    page.locator("section[aria-label='Queue reports']").get_by_role("link", name="Settings").click()
    page.wait_for_url(re.compile(r"/queues/reports$"))
    page.locator("input[name=max_attempts]").fill("0")
    page.get_by_role("button", name="Save settings").click()
    assert "Not saved" in page.get_by_role("alert").inner_text()
    assert queue.queue_settings("reports").max_attempts == 20  # nothing written
    screenshot(page, "queue-settings-refused")
    page.locator("input[name=max_attempts]").fill("7")
    page.locator("input[name=lease]").fill("2m")
    page.locator("input[name=retain_done]").fill("2h")
    page.get_by_role("button", name="Save settings").click()
    page.wait_for_url(re.compile(r"/queues/reports$"))
    assert page.get_by_role("status").count() == 1
    settings = queue.queue_settings("reports")
    assert (settings.max_attempts, settings.lease) == (7, 120)
    assert settings.retain_done == 7200
    assert page.locator("input[name=max_attempts]").input_value() == "7"
    (entry,) = [e for e in queue.audit_log() if e.action == "configure"]
    assert entry.actor.startswith("dashboard:")


def _busy_hour(queue: leaseq.Queue) -> None:
    """An hour of work by the schema's clock: a minute's jobs claimed, most done after
    0.2-3 s, a few failed; then a backlog and a few jobs running now."""
    for minute in range(60):
        start = minute * 60.0
        for name, scale, errors in (("reports", 1.0, ("template missing",)), ("emails", 0.4, ())):
            wave = 6 + 5 * math.sin(minute / 9) + (minute % 7) / 2
            count = max(1, round(wave * scale))
            set_clock_offset(queue, start)
            queue.enqueue_many(name, [{"customer": f"c{minute % 9}", "n": n} for n in range(count)])
            claims = queue.claim(name, limit=count, lease=60)
            failing = claims[: 1 if errors and minute % 11 in {3, 4} else 0]
            for claim in failing:
                queue.fail(claim, errors[0])
            rest = claims[len(failing) :]
            for part, seconds in enumerate((0.2, 0.6, 1.4, 3.1)):
                set_clock_offset(queue, start + seconds)
                queue.complete_many(rest[part::4])
    set_clock_offset(queue, 60 * 60.0)
    queue.enqueue_many("reports", [{"customer": "backlog", "n": n} for n in range(14)])
    queue.claim("reports", limit=3, lease=60)
    queue.configure_queue("emails", max_queued_jobs=200)
    queue.enqueue_many("emails", [{"to": f"u{n}@example.com"} for n in range(37)])


def test_overview_of_a_busy_hour(page: Any, dashboard: Served, tables: leaseq.Queue) -> None:
    """The overview as it looks on a working system (the README's screenshot)."""
    queue = tables
    _busy_hour(queue)
    page.goto(f"{dashboard.url}/")
    reports = page.locator("section[aria-label='Queue reports']")
    reports.wait_for()
    bars = reports.locator("svg[role='img'] rect[fill='#2f9e6b']")
    assert bars.count() >= 55  # the hour's minutes, each with work done
    assert reports.locator("svg[role='img'] rect[fill='#d9534f']").count() >= 8
    assert reports.locator(".count-running .n").inner_text().strip() == "3"
    screenshot(page, "overview-busy-hour", full_page=False)


def test_live_refresh_pauses_while_the_tab_is_hidden(
    page: Any, dashboard: Served, tables: leaseq.Queue
) -> None:
    """The overview polls its live part every few seconds while visible; hidden, it
    sends nothing (a tab in the background costs the database nothing); shown
    again, it refreshes at once."""
    tables.enqueue("reports", {"n": 1})
    polls: list[float] = []
    page.on(
        "request", lambda r: polls.append(time.monotonic()) if "/live/overview" in r.url else None
    )
    page.goto(dashboard.url + "/")
    deadline = time.monotonic() + 15
    while not polls and time.monotonic() < deadline:
        page.wait_for_timeout(200)
    assert polls, "the visible overview never refreshed"
    # Hide the tab as the browser would (visibilityState and its event).
    page.evaluate(
        "Object.defineProperty(document, 'visibilityState',"
        " {configurable: true, get: () => 'hidden'});"
        "document.dispatchEvent(new Event('visibilitychange'))"
    )
    hidden_from = time.monotonic()
    page.wait_for_timeout(12_000)  # more than two refresh periods
    assert [t for t in polls if t > hidden_from + 0.5] == []
    shown_at = time.monotonic()
    page.evaluate(
        "Object.defineProperty(document, 'visibilityState',"
        " {configurable: true, get: () => 'visible'});"
        "document.dispatchEvent(new Event('visibilitychange'))"
    )
    deadline = time.monotonic() + 5
    while not [t for t in polls if t >= shown_at] and time.monotonic() < deadline:
        page.wait_for_timeout(100)
    assert [t for t in polls if t >= shown_at], "showing the tab did not refresh it"
