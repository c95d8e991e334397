"""Every dashboard page renders against a schema with jobs in every state, says
what is there, masks secrets and keeps to the Content-Security-Policy."""

from __future__ import annotations

import asyncio
import dataclasses
import re
from collections.abc import Callable
from html import unescape
from typing import Any

import httpx
import psycopg
import pytest

import leaseq
from leaseq.web import create_app
from leaseq.web.data import Aggregates, SharedCache
from leaseq.web.security import CSP

from .test_web_fixtures import (
    SECRET_VALUE,
    AppFactory,
    Browser,
    Jobs,
    browser,
    csp_problems,
    jobs,
    make_app,
    text_of,
)

__all__ = ["browser", "jobs", "make_app"]  # fixtures, used by name


def pages(jobs: Jobs) -> list[str]:
    return [
        "/",
        "/live/overview",
        "/jobs",
        "/jobs?queue=reports&state=failed",
        "/jobs?payload=customer:acme",
        "/jobs?error=template&state=failed",
        "/jobs?key=cust-1&queue=emails",
        "/jobs?state=done",
        *(f"/jobs/{job_id}" for job_id in (jobs.secret, jobs.running, jobs.done, jobs.failed[0])),
        f"/jobs/{jobs.running}/live",
        f"/jobs/{jobs.cancelled}",
        f"/jobs/{jobs.blocked_head}",
        f"/jobs/{jobs.blocked_waiting[0]}",
        "/failed",
        "/failed?queue=emails",
        "/blocked",
        "/running",
        "/live/running",
        "/audit",
        "/queues/reports",
        "/queues/emails",
    ]


async def test_every_page_renders_with_csp_and_without_secrets(
    browser: Browser, jobs: Jobs
) -> None:
    for path in pages(jobs):
        response = await browser.get(path)
        assert response.status_code == 200, (path, response.text[:500])
        assert response.headers["content-security-policy"] == CSP, path
        assert response.headers["x-content-type-options"] == "nosniff"
        assert response.headers["x-frame-options"] == "DENY"
        assert response.headers["referrer-policy"] == "same-origin"
        assert csp_problems(response.text) == [], path
        assert SECRET_VALUE not in response.text, path
        assert "k-123" not in response.text, path
    static = await browser.get("/static/leaseq.js")
    assert static.status_code == 200
    assert static.headers["content-security-policy"] == CSP


async def test_overview_shows_each_queue(browser: Browser, jobs: Jobs) -> None:
    page = text_of((await browser.get("/")).text)
    assert "reports" in page
    assert "emails" in page
    assert "Last hour: 1 done · 3 failed" in page
    assert "Admission (jobs)" in page
    assert "no limit" in page  # reports has none
    assert "done 1d · cancelled 7d · failed 30d · delete" in page
    assert "Run time p50 / p95 / p99" in page
    # An estimate is labelled: exact counts here, so no ≈ mark shows.
    assert "≈" not in page.split("Counts marked")[0]


async def test_the_overview_says_which_limit_each_number_is(
    browser: Browser, jobs: Jobs, queue: leaseq.Queue
) -> None:
    """A per-group running limit alone read "Limits · 2 per group": a dangling
    separator, and no word of what the 2 counts (running jobs, not starts)."""
    queue.configure_queue("emails", max_running_per_group=2)
    queue.configure_queue("reports", max_running=5, rate_limit_per_group=(600, 60))
    page = text_of((await browser.get("/")).text)
    assert "Limits 2 running per group" in page
    assert "Limits 5 running · 600 starts per group per 1m" in page


async def test_the_overview_of_thousands_of_queues_shows_those_with_work(
    browser: Browser, queue: leaseq.Queue
) -> None:
    """5,000 queues: the Overview read each queue's settings by a statement of its
    own and a minute-by-minute hour for every queue, and rendered them all (seconds,
    megabytes; a 503 once the statement timeout struck). It shows the queues with the
    most failed, then queued and running jobs, and says how many it leaves out."""
    with queue.connection() as conn:
        conn.execute(
            f'INSERT INTO "{queue.schema}".queue (name)'
            " SELECT 'idle-' || lpad(i::text, 5, '0') FROM generate_series(1, 5000) AS i"
        )
    queue.enqueue("zz-busy", {})  # last by name
    queue.enqueue("zz-failing", {})
    (claim,) = queue.claim("zz-failing")
    queue.fail(claim, "boom")
    response = await browser.get("/")
    assert response.status_code == 200
    page = text_of(response.text)
    assert "zz-busy" in page
    assert "zz-failing" in page
    assert "idle-00001" in page  # then by name
    assert "idle-05000" not in page
    assert "of 5,002 queues" in page
    assert len(response.text) < 1_000_000  # all of them: ~50 MB


async def test_job_page_masks_secrets_and_shows_the_job(
    browser: Browser, jobs: Jobs, queue: leaseq.Queue
) -> None:
    page = (await browser.get(f"/jobs/{jobs.secret}")).text
    assert "acme" in page
    assert "password" in page  # the field name shows, its value does not
    assert SECRET_VALUE not in page
    assert "k-123" not in page
    assert "••••••" in unescape(page)

    running = text_of((await browser.get(f"/jobs/{jobs.running}")).text)
    assert "Lease remaining" in running
    assert "Cancel running job" in running
    assert f"Lease version {jobs.running_claim.lease_version}" in running
    assert "No retry while it runs" in running
    assert "Replay" not in running.split("History")[0]

    failed = text_of((await browser.get(f"/jobs/{jobs.failed[0]}")).text)
    assert "template missing" in failed
    assert "Replay" in failed

    unique = queue.enqueue("reports", {}, unique_key="invoice:42", timeout=90)
    shown = text_of((await browser.get(f"/jobs/{unique}")).text)
    assert "Unique key invoice:42" in shown
    assert "Timeout 90 s (its own)" in shown

    waiting = text_of((await browser.get(f"/jobs/{jobs.blocked_waiting[1]}")).text)
    assert "cust-1" in waiting
    assert "1 unfinished ahead of it" in waiting  # the failed head is finished
    # Behind the failed head: held back by it, whatever is ahead of it.
    assert f"queued: blocked by failed job #{jobs.blocked_head} (replay or skip it)" in waiting


async def test_the_jobs_pages_show_every_job_of_their_window_while_jobs_are_enqueued(
    make_app: AppFactory, queue: leaseq.Queue
) -> None:
    """Paging "older →" through the Jobs list while producers enqueue must neither
    skip nor repeat a job: each page measured the search window from the newest job
    of its own time, so the jobs enqueued meanwhile pushed the older jobs of the
    first page's window, not shown yet, out of the next page (here all of them:
    the second page was empty, "older jobs were not searched")."""
    browser = Browser(make_app(search_window=100))
    try:
        window = queue.enqueue_many("work", [{"n": n} for n in range(150)])[-100:]
        shown: list[int] = []
        path: str | None = "/jobs"
        while path is not None:
            page = (await browser.get(path)).text
            shown += [int(i) for i in re.findall(r'href="/jobs/(\d+)">#', page)]
            queue.enqueue_many("work", [{"n": n} for n in range(60)])  # between pages
            older = re.search(r'<a href="([^"]*)">older →</a>', page)
            path = unescape(older[1]) if older else None
        assert shown == sorted(window, reverse=True)
    finally:
        await browser.close()


async def test_jobs_filters_and_keyset_pages(
    browser: Browser, jobs: Jobs, queue: leaseq.Queue
) -> None:
    page = (await browser.get("/jobs?queue=reports&state=failed")).text
    for job_id in jobs.failed:
        assert f"#{job_id}<" in page
    assert f"#{jobs.done}<" not in page
    errors = (await browser.get("/jobs?state=failed&error=template")).text
    assert f"#{jobs.failed[2]}<" not in errors
    assert f"#{jobs.failed[0]}<" in errors
    payload = (await browser.get("/jobs?payload=customer:acme+n:2")).text
    assert f"#{jobs.failed[2]}<" in payload
    assert f"#{jobs.failed[0]}<" not in payload

    queue.enqueue_many("bulk", [{"n": n} for n in range(60)])
    first = await browser.get("/jobs?queue=bulk")
    assert first.text.count('href="/jobs/') == 50
    older = first.text.split('">older →')[0].rsplit('href="', 1)[1]
    second = await browser.get(unescape(older))
    assert second.text.count('href="/jobs/') == 10
    assert "older →" not in second.text


async def test_a_bad_filter_is_a_clear_error(browser: Browser, jobs: Jobs) -> None:
    response = await browser.get("/jobs?payload=customer")
    assert response.status_code == 400
    assert "is not field:value" in unescape(response.text)
    secret = await browser.get("/jobs?payload=password:hunter2")
    assert secret.status_code == 400
    assert "cannot be searched" in unescape(secret.text)
    assert (await browser.get("/jobs?state=lost")).status_code == 400
    assert (await browser.get("/jobs/999999999")).status_code == 404


async def test_failed_blocked_running_and_audit(browser: Browser, jobs: Jobs) -> None:
    failed = text_of((await browser.get("/failed")).text)
    assert "template missing 2" in failed
    assert "customer not found 1" in failed
    assert "smtp refused 1" in failed

    blocked = text_of((await browser.get("/blocked")).text)
    assert "cust-1" in blocked
    assert f"#{jobs.blocked_head}" in blocked
    assert "smtp refused" in blocked
    assert "Skip head" in blocked

    overview = text_of((await browser.get("/")).text)
    assert "Blocked keys 1 held by a failed head" in overview

    running = (await browser.get("/running")).text
    assert f"#{jobs.running}<" in running
    assert 'name="running" value="1"' in running

    audit = text_of((await browser.get("/audit")).text)
    assert "cancel" in audit  # populate cancelled one job through the library


async def test_an_expired_lease_is_highlighted(
    browser: Browser, jobs: Jobs, queue: leaseq.Queue
) -> None:
    leaseq.testing.set_clock_offset(queue, 400)  # past the 300 s lease
    page = (await browser.get("/running")).text
    assert 'class="expired"' in page
    assert "waiting for recovery" in page
    overview = text_of((await browser.get("/")).text)
    assert "1 waiting for recovery" in overview


async def test_read_only_pages_hide_the_buttons(make_app: AppFactory, jobs: Jobs) -> None:
    client = Browser(make_app(read_only=True))
    try:
        for path in (
            "/",
            f"/jobs/{jobs.failed[0]}",
            "/blocked",
            "/running",
            "/queues/reports",
            "/schedules",
        ):
            page = await client.get(path)
            assert page.status_code == 200, path
            assert 'method="post"' not in page.text, path
        assert "read-only" in (await client.get("/")).text
    finally:
        await client.close()


async def test_many_tabs_cost_one_read_of_the_aggregates(
    make_app: AppFactory, jobs: Jobs, monkeypatch: pytest.MonkeyPatch
) -> None:
    app = make_app(cache_seconds=60)
    client = app.state.leaseq.client
    calls = {"stats": 0, "activity": 0, "health": 0}
    for name in calls:
        original = getattr(client, name)

        def counted(*args: object, _original: object = original, _name: str = name, **kw: object):  # type: ignore[no-untyped-def]
            calls[_name] += 1
            return _original(*args, **kw)  # type: ignore[operator]

        monkeypatch.setattr(client, name, counted)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://dash.test") as http:
        answers = await asyncio.gather(*(http.get("/live/overview") for _ in range(20)))
    assert {a.status_code for a in answers} == {200}
    assert calls == {"stats": 1, "activity": 1, "health": 1}


async def test_a_statement_timeout_is_a_friendly_page(
    make_app: AppFactory, jobs: Jobs, schema: str, connect: Callable[..., psycopg.Connection[Any]]
) -> None:
    """A real timeout: another session holds the job table locked, the search waits
    past the dashboard's statement timeout and is cancelled by the server."""
    http = Browser(make_app(statement_timeout=0.3))
    locker = connect()
    try:
        with locker.transaction():
            locker.execute(f'LOCK TABLE "{schema}".job IN ACCESS EXCLUSIVE MODE')
            response = await http.get("/jobs?state=done")
        assert response.status_code == 503
        assert "took too long" in response.text
        assert response.headers["content-security-policy"] == CSP
        assert (await http.get("/jobs?state=done")).status_code == 200  # and it recovers
    finally:
        await http.close()


async def test_estimates_are_labelled(
    make_app: AppFactory, jobs: Jobs, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A large table's finished counts are estimates: the page marks them ≈."""
    app = make_app()
    client = app.state.leaseq.client
    exact = await client.stats()

    async def estimated(queue: str | None = None) -> list[leaseq.QueueStats]:
        done = {leaseq.JobStatus.DONE, leaseq.JobStatus.CANCELLED}
        return [dataclasses.replace(s, estimated=frozenset(done)) for s in exact]

    monkeypatch.setattr(client, "stats", estimated)
    http = Browser(app)
    try:
        page = (await http.get("/")).text
    finally:
        await http.close()
    assert page.count('<abbr title="estimate">≈</abbr>') == 2 * len(exact)


async def test_health_warnings_show_on_the_overview(
    make_app: AppFactory, jobs: Jobs, monkeypatch: pytest.MonkeyPatch
) -> None:
    app = make_app()
    client = app.state.leaseq.client
    real = await client.health()

    async def warned(**_: object) -> leaseq.Health:
        return dataclasses.replace(real, warnings=("pid 4242 (psql) has had a transaction open",))

    monkeypatch.setattr(client, "health", warned)
    http = Browser(app)
    try:
        page = text_of((await http.get("/")).text)
    finally:
        await http.close()
    assert "Health pid 4242 (psql) has had a transaction open" in page


async def test_the_timeline_tells_a_lost_lease_and_a_recovery(
    browser: Browser, queue: leaseq.Queue
) -> None:
    job_id = queue.enqueue("reports", {"customer": "acme"})
    queue.claim("reports", lease=10)
    leaseq.testing.set_clock_offset(queue, 20)
    (recovered,) = queue.claim("reports", lease=300)
    assert recovered.recovered
    queue.retry(recovered, error="upstream timed out", delay=0)
    page = text_of((await browser.get(f"/jobs/{job_id}")).text)
    assert "run 1 claimed, lease version 1" in page
    assert "lease expired (worker lost)" in page
    assert "run 2 claimed, lease version 2" in page
    assert "run 2: failed, retried later" in page
    assert "upstream timed out" in page


async def test_the_timeline_numbers_runs_across_a_replay_and_shows_the_last_claim(
    browser: Browser, queue: leaseq.Queue
) -> None:
    job_id = queue.enqueue("reports", {"n": 1}, max_attempts=1)
    (first,) = queue.claim("reports")
    queue.fail(first, "template missing")
    assert queue.replay(job_id, actor="dashboard:alice")
    (second,) = queue.claim("reports")
    queue.complete(second)
    page = text_of((await browser.get(f"/jobs/{job_id}")).text)
    order = [
        "run 1 claimed, lease version 1",
        "run 1: failed",
        "replayed",
        f"run 2 claimed, lease version {second.lease_version}",
        "run 2: done",
    ]
    positions = [page.index(text) for text in order]
    assert positions == sorted(positions), page
    assert "run 3" not in page
    assert "Last error (of an earlier run)" in page


def _events(html: str) -> list[str]:
    """The Job page's timeline, an entry's text each (its error included)."""
    listed = re.search(r'<ol class="timeline">(.*?)</ol>', html, re.S)
    assert listed is not None, html[:500]
    return [text_of(item).strip() for item in re.findall(r"<li.*?</li>", listed[1], re.S)]


async def test_the_timeline_tells_a_lease_lost_on_the_last_attempt_as_the_failure(
    browser: Browser, queue: leaseq.Queue
) -> None:
    """The reaper fails a job whose lease expired on its last attempt, its history
    entry saying lease_expired: the timeline read it as "recovered by the next
    claim" and never showed the failure (nothing claims a failed job again)."""
    job_id = queue.enqueue("reports", {"n": 1}, max_attempts=1)
    queue.claim("reports", lease=10)
    leaseq.testing.set_clock_offset(queue, 20)
    queue.reap()
    job = queue.get(job_id)
    assert job.status is leaseq.JobStatus.FAILED
    assert job.last_error
    events = _events((await browser.get(f"/jobs/{job_id}")).text)
    assert not [e for e in events if "recovered" in e], events
    assert events[-1].endswith(
        f"run 1: lease expired on its last attempt (worker lost): failed {job.last_error}"
    ), events


async def test_the_timeline_numbers_runs_from_their_attempts_once_old_entries_are_gone(
    browser: Browser, queue: leaseq.Queue
) -> None:
    """A job's history keeps its newest 50 entries: after 60 retries the oldest
    kept run is run 11 (its entry says attempt 11), but the timeline numbered runs
    from 1, called the run going on "run 51" beside "attempt 61", and did not say
    that anything was left out."""
    queue.configure_queue("retries", max_attempts=100, backoff_base=0, backoff_cap=0)
    job_id = queue.enqueue("retries", {"n": 1})
    for n in range(60):
        (claim,) = queue.claim("retries")
        queue.retry(claim, delay=0, error=f"boom {n + 1}")
    queue.claim("retries")
    job = queue.get(job_id)
    assert (len(job.history), job.history[0]["attempt"]) == (50, 11)
    events = _events((await browser.get(f"/jobs/{job_id}")).text)
    assert events[1].endswith(
        "at least 10 earlier runs not kept (a job's history keeps its newest 50 entries)"
    ), events[:3]
    assert events[2].endswith("run 11 claimed, lease version 11"), events[:3]
    assert events[3].endswith("run 11: failed, retried later boom 11"), events[:4]
    assert "run 60: failed, retried later boom 60" in events[-2]
    assert "run 61 running (attempt 61 of 100)" in events[-1]


async def test_a_job_held_back_by_its_keys_failed_head_says_so(
    browser: Browser, jobs: Jobs, queue: leaseq.Queue
) -> None:
    """A job waiting behind its key's failed head (the ``block`` policy) runs only
    once an operator replays or skips that head: its page said "0 unfinished ahead
    of it" and "queued: claimable from here on" (failed jobs are not unfinished)."""
    head, waiting = jobs.blocked_head, jobs.blocked_waiting[0]
    html = (await browser.get(f"/jobs/{waiting}")).text
    events = _events(html)
    assert "claimable" not in events[-1], events
    assert events[-1].endswith(f"queued: blocked by failed job #{head} (replay or skip it)")
    assert text_of(html).count(f"blocked by failed job #{head} (replay or skip it)") == 2
    assert len(re.findall(rf'<a href="/jobs/{head}">', html)) == 2  # the facts and the timeline
    # The head itself, and a job of a queue whose policy lets keys continue, are not.
    assert "blocked by" not in text_of((await browser.get(f"/jobs/{head}")).text)
    queue.configure_queue("emails", ordering_policy="continue")
    events = _events((await browser.get(f"/jobs/{waiting}")).text)
    assert events[-1].endswith("queued: claimable from here on"), events


async def test_the_audit_log_pages(browser: Browser, queue: leaseq.Queue) -> None:
    ids = queue.enqueue_many("reports", [{"n": n} for n in range(55)])
    for job_id in ids:
        queue.cancel(job_id, actor="script:cleanup")
    first = await browser.get("/audit")
    assert first.text.count("<td>script:cleanup</td>") == 50
    with queue.connection() as conn:
        role = conn.execute("SELECT session_user").fetchone()[0]  # type: ignore[index]
    # Beside the actor the call named, the role the server authenticated.
    assert first.text.count(f"<td>script:cleanup</td>\n    <td>{role}</td>") == 50
    older = first.text.split('">older →')[0].rsplit('href="', 1)[1]
    second = await browser.get(unescape(older))
    assert second.text.count("<td>script:cleanup</td>") == 5
    assert "older →" not in second.text
    assert "← newest" in second.text


async def test_the_running_page_shows_running_jobs_older_than_the_search_window(
    make_app: AppFactory, queue: leaseq.Queue
) -> None:
    old = queue.enqueue("reports", {"n": 0})
    queue.claim("reports", lease=300)
    queue.enqueue_many("reports", [{"n": n} for n in range(1, 30)])
    client = Browser(make_app(search_window=10))
    try:
        running = (await client.get("/running")).text
        assert f"#{old}<" in running
        # The Jobs search is the one bounded by the window (and says so).
        jobs = text_of((await client.get("/jobs?state=running")).text)
        assert f"#{old}" not in jobs
    finally:
        await client.close()


async def test_no_page_shows_a_dsn_password(database_url: str, schema: str) -> None:
    """The dashboard's own DSN, and DSNs quoted in errors or payloads, keep their
    passwords out of every page (the test servers trust any password)."""
    password = "s3cr3t-pw-4217"
    dsn = psycopg.conninfo.make_conninfo(database_url, password=password)
    with leaseq.Queue(dsn, schema=schema) as queue:
        queue.migrate()
        job_id = queue.enqueue(
            "reports", {"note": f"copied from postgresql://app:{password}@db.internal/app"}
        )
        (claim,) = queue.claim("reports")
        queue.fail(claim, f"could not connect to {dsn}")
    app = create_app(dsn, schema=schema)
    client = Browser(app)
    try:
        for path in ("/", "/jobs", f"/jobs/{job_id}", "/failed", "/running", "/audit"):
            page = await client.get(path)
            assert page.status_code == 200, path
            assert password not in page.text, path
    finally:
        await client.close()
        await app.state.leaseq.client.close()


def _listed(page: str) -> set[int]:
    """The job ids a Jobs page lists."""
    return {int(job_id) for job_id in re.findall(r'href="/jobs/(\d+)"', page)}


async def test_payload_values_are_searched_as_typed(browser: Browser, queue: leaseq.Queue) -> None:
    """A quoted value is a string; an unquoted one is the JSON number or boolean it
    spells, and a number JSON never writes (a leading zero: a zip code) is a
    string too, not an error."""
    texts = queue.enqueue("orders", {"zip": "01234", "code": "75001", "gift": "true"})
    values = queue.enqueue("orders", {"code": 75001, "gift": True, "n": 0})
    for typed, found in [
        ("zip:01234", {texts}),
        ('zip:"01234"', {texts}),
        ("code:75001", {values}),
        ('code:"75001"', {texts}),
        ("code:'75001'", {texts}),
        ("gift:true", {values}),
        ('gift:"true"', {texts}),
        ("n:0", {values}),
        ("n:-00", set()),
    ]:
        page = await browser.get("/jobs", params={"payload": typed})
        assert page.status_code == 200, typed
        assert _listed(page.text) == found, typed
    bulk = await browser.post("/replay", {"payload": "zip:01234"})
    assert bulk.status_code == 200
    assert "No failed jobs match" in text_of(bulk.text)


@pytest.mark.parametrize("path", ["/jobs?before=%C2%B2", "/audit?before=%C2%B2", "/jobs?before=٣"])
async def test_a_number_in_other_digits_is_a_clear_error(
    browser: Browser, queue: leaseq.Queue, path: str
) -> None:
    """Only ASCII digits make an id: '²' (which int() refuses) and '٣' (which it
    reads as 3) get a 400 saying what is wrong."""
    response = await browser.get(path)
    assert response.status_code == 400
    assert "before must be" in text_of(response.text)


async def test_with_the_database_down_a_page_leaves_no_load_behind(schema: str) -> None:
    """A page that finds the database unreachable says so (503), and none of the loads
    it started is still waiting for the database afterwards: the next page tries
    the database itself, not behind the previous page's leftovers."""
    app = create_app("postgresql://postgres@127.0.0.1:1/nowhere", schema=schema)
    dashboard = app.state.leaseq
    # The same dashboard on a client that gives up sooner (the app's waits 10 s).
    dashboard.client = leaseq.AsyncQueue(
        "postgresql://postgres@127.0.0.1:1/nowhere", schema=schema, connect_timeout=1
    )
    dashboard.aggregates = Aggregates(dashboard.client, SharedCache(2.0))
    client = Browser(app)
    try:
        for path in ("/", "/live/overview", "/failed"):
            response = await client.get(path)
            assert response.status_code == 503, path
            assert "cannot be reached" in text_of(response.text)
            assert dashboard.aggregates.cache.loading == 0, path
    finally:
        await client.close()
        await dashboard.client.close()
