"""The dashboard's refusals: cross-site requests, missing CSRF tokens, read-only
mode, missing permissions, missing credentials; and its cookies."""

from __future__ import annotations

import base64
import re
from html import unescape

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Mount, Route

import leaseq
from leaseq import JobStatus
from leaseq.web import BasicAuth, Principal, TokenAuth

from .test_web_fixtures import (
    BASE,
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

TOKEN = "a-long-enough-test-token"


def _still_failed(queue: leaseq.Queue, jobs: Jobs) -> None:
    """The refused replays wrote nothing: the job is still failed, not replayed."""
    assert queue.get(jobs.failed[0]).status is JobStatus.FAILED
    assert all(e.action != "replay" for e in queue.audit_log())


async def test_a_post_without_a_valid_csrf_token_is_refused(
    browser: Browser, jobs: Jobs, queue: leaseq.Queue
) -> None:
    path = f"/jobs/{jobs.failed[0]}/replay"
    missing = await browser.post(path, csrf=False)
    assert missing.status_code == 403
    assert "security token" in text_of(missing.text)
    wrong = await browser.post(path, {"csrf": "0" * 64})
    assert wrong.status_code == 403
    # A token of another session (another browser) is no good here either.
    other = Browser(browser.app)
    try:
        foreign = await other.token()
    finally:
        await other.close()
    assert (await browser.post(path, {"csrf": foreign})).status_code == 403
    _still_failed(queue, jobs)


async def test_cross_site_requests_are_refused(
    browser: Browser, jobs: Jobs, queue: leaseq.Queue
) -> None:
    path = f"/jobs/{jobs.failed[0]}/replay"
    origin = await browser.post(path, headers={"origin": "https://evil.example"})
    assert origin.status_code == 403
    assert "another origin" in text_of(origin.text)
    for site in ("cross-site", "same-site"):
        response = await browser.post(path, headers={"sec-fetch-site": site})
        assert response.status_code == 403, site
    # Without either header (curl, scripts) the token alone decides; "none" is a
    # user typing the URL.
    ok = await browser.post(path, headers={"sec-fetch-site": "none"})
    assert ok.status_code == 303
    assert queue.get(jobs.failed[0]).status is JobStatus.QUEUED


async def test_read_only_refuses_every_action(
    make_app: AppFactory, jobs: Jobs, queue: leaseq.Queue
) -> None:
    client = Browser(make_app(read_only=True))
    try:
        for path, data in [
            (f"/jobs/{jobs.failed[0]}/replay", {}),
            (f"/jobs/{jobs.queued}/cancel", {}),
            (f"/jobs/{jobs.running}/cancel", {"running": "1"}),
            (f"/jobs/{jobs.blocked_head}/skip", {}),
            ("/replay", {"queue": "reports"}),
            ("/replay/confirm", {"ids": str(jobs.failed[0])}),
            ("/queues/reports/pause", {}),
            ("/queues/reports/settings", {"lease": "10m"}),
            ("/schedules/remove", {"name": "any"}),
        ]:
            response = await client.post(path, data)
            assert response.status_code == 403, path
            assert "read-only" in response.text
    finally:
        await client.close()
    assert queue.get(jobs.queued).status is JobStatus.QUEUED
    assert queue.get(jobs.running).status is JobStatus.RUNNING
    assert queue.get(jobs.blocked_head).status is JobStatus.FAILED
    settings = queue.queue_settings("reports")
    assert settings is not None
    assert (settings.paused, settings.lease) == (False, 60.0)
    _still_failed(queue, jobs)


async def test_permissions_come_from_the_auth_callable(
    make_app: AppFactory, jobs: Jobs, queue: leaseq.Queue
) -> None:
    async def auth(request: Request) -> Principal | None:  # async callables work too
        user = request.headers.get("x-user")
        grants = {"viewer": {"read"}, "oncall": {"read", "cancel"}}
        return Principal(user, frozenset(grants[user])) if user in grants else None

    app = make_app(auth=auth)
    nobody = Browser(app)
    viewer = Browser(app, headers={"x-user": "viewer"})
    oncall = Browser(app, headers={"x-user": "oncall"})
    try:
        assert (await nobody.get("/")).status_code == 401
        page = await viewer.get(f"/jobs/{jobs.failed[0]}")
        assert page.status_code == 200
        assert 'method="post"' not in page.text  # no buttons it may not use
        refused = await viewer.post(f"/jobs/{jobs.failed[0]}/replay")
        assert refused.status_code == 403
        assert "(replay)" in text_of(refused.text)
        assert (await oncall.post(f"/jobs/{jobs.failed[0]}/replay")).status_code == 403
        cancelled = await oncall.post(f"/jobs/{jobs.queued}/cancel")
        assert cancelled.status_code == 303
    finally:
        for client in (nobody, viewer, oncall):
            await client.close()
    assert queue.get(jobs.queued).status is JobStatus.CANCELLED
    (entry,) = [e for e in queue.audit_log() if e.actor.startswith("dashboard:")]
    assert entry.actor == "dashboard:oncall"
    _still_failed(queue, jobs)


async def test_a_principal_without_read_sees_nothing(make_app: AppFactory, jobs: Jobs) -> None:
    client = Browser(make_app(auth=lambda request: Principal("ghost", frozenset())))
    try:
        assert (await client.get("/")).status_code == 403
        assert (await client.get(f"/jobs/{jobs.secret}")).status_code == 403
    finally:
        await client.close()


async def test_token_auth_bearer_and_browser_login(make_app: AppFactory, jobs: Jobs) -> None:
    app = make_app(auth=TokenAuth(TOKEN))
    anonymous = Browser(app)
    bearer = Browser(app, headers={"authorization": f"Bearer {TOKEN}"})
    try:
        for path in ("/", "/jobs", f"/jobs/{jobs.failed[0]}", "/live/overview"):
            response = await anonymous.get(path)
            assert response.status_code == 401, path
            assert 'name="token"' in response.text  # the login form
            assert csp_problems(response.text) == []
            assert "reports" not in response.text
        assert (await anonymous.post(f"/jobs/{jobs.failed[0]}/replay")).status_code == 401
        assert (await bearer.get("/")).status_code == 200
        wrong = await Browser(app, headers={"authorization": "Bearer nope"}).get("/")
        assert wrong.status_code == 401

        bad = await anonymous.post("/login", {"token": "not it"})
        assert bad.status_code == 401
        assert "not the right one" in bad.text
        login = await anonymous.post("/login", {"token": TOKEN})
        assert login.status_code == 303
        assert "leaseq_login" in login.headers["set-cookie"]
        assert "HttpOnly" in login.headers["set-cookie"]
        assert (await anonymous.get("/")).status_code == 200
        assert (await anonymous.post(f"/jobs/{jobs.failed[0]}/replay")).status_code == 303
        logout = await anonymous.post("/logout")
        assert logout.status_code == 303
        assert (await anonymous.get("/")).status_code == 401
    finally:
        await anonymous.close()
        await bearer.close()


async def test_basic_auth(make_app: AppFactory, jobs: Jobs) -> None:
    app = make_app(auth=BasicAuth("ops", "s3cret-pass"))

    def basic(user: str, password: str) -> dict[str, str]:
        encoded = base64.b64encode(f"{user}:{password}".encode()).decode()
        return {"authorization": f"Basic {encoded}"}

    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url=BASE) as http:
        missing = await http.get("/")
        assert missing.status_code == 401
        assert missing.headers["www-authenticate"].startswith("Basic")
        assert (await http.get("/", headers=basic("ops", "wrong"))).status_code == 401
        assert (await http.get("/", headers=basic("ops", "s3cret-pass"))).status_code == 200
        assert (await http.get("/", headers={"authorization": "Basic !!!"})).status_code == 401


async def test_cookies_and_redirects_stay_within_the_app(browser: Browser, jobs: Jobs) -> None:
    first = await browser.get("/")
    cookie = first.headers["set-cookie"]
    assert cookie.startswith("leaseq_session=")
    # (Lax: no cross-site POST carries it, a link from another site does.)
    for attribute in ("HttpOnly", "SameSite=lax", "Path=/"):
        assert attribute.lower() in cookie.lower(), attribute
    response = await browser.post(
        f"/jobs/{jobs.queued}/cancel", {"next": "https://evil.example/phish"}
    )
    assert response.headers["location"] == "/"
    other = await browser.post(f"/jobs/{jobs.failed[0]}/replay", {"next": "//evil.example/x"})
    assert other.headers["location"] == "/"


@pytest.mark.parametrize("next_path", ["/\\evil.example", "/\\/evil.example", "/\t/evil.example"])
async def test_a_next_path_a_browser_reads_as_another_host_is_refused(
    browser: Browser, jobs: Jobs, next_path: str
) -> None:
    """Browsers read a backslash as a slash (and drop tabs and newlines): ``/\\evil``
    is ``//evil``, another site. Neither the redirect nor the confirmation's link
    may lead there."""
    response = await browser.post(f"/jobs/{jobs.queued}/cancel", {"next": next_path})
    assert response.headers["location"] == "/"
    confirm = await browser.post("/replay", {"queue": "reports", "next": next_path})
    assert confirm.status_code == 200
    assert "evil" not in confirm.text
    assert 'href="/">Back' in confirm.text


async def test_mounted_under_a_path(make_app: AppFactory, jobs: Jobs, queue: leaseq.Queue) -> None:
    outer = Starlette(routes=[Mount("/ops/queue", app=make_app())])
    client = Browser(outer)
    try:
        page = await client.get("/ops/queue/")
        assert page.status_code == 200
        assert 'href="/ops/queue/static/leaseq.css"' in page.text
        assert 'href="/ops/queue/jobs"' in page.text
        assert "Path=/ops/queue" in page.headers["set-cookie"]
        assert (await client.get("/ops/queue/static/leaseq.css")).status_code == 200
        token = await client.token("/ops/queue/")
        response = await client.post(f"/ops/queue/jobs/{jobs.failed[0]}/replay", {"csrf": token})
        assert response.headers["location"] == f"/ops/queue/jobs/{jobs.failed[0]}"
        assert queue.get(jobs.failed[0]).status is JobStatus.QUEUED
        confirm = await client.post(
            "/ops/queue/replay", {"csrf": token, "queue": "reports", "next": "/failed"}
        )
        assert 'href="/ops/queue/failed"' in confirm.text
        ids = re.search(r'name="ids" value="([^"]+)"', confirm.text)
        assert ids is not None
        done = await client.post(
            "/ops/queue/replay/confirm", {"csrf": token, "ids": ids[1], "next": "/failed"}
        )
        assert done.headers["location"] == "/ops/queue/failed"
        assert {queue.get(i).status for i in jobs.failed} == {JobStatus.QUEUED}
    finally:
        await client.close()


async def test_an_unexpected_error_is_a_page_with_the_headers(
    make_app: AppFactory, jobs: Jobs, monkeypatch: pytest.MonkeyPatch
) -> None:
    app = make_app()

    async def broken(job_id: int) -> None:
        raise RuntimeError("a bug")

    monkeypatch.setattr(app.state.leaseq.client, "get", broken)
    http = Browser(app)
    try:
        response = await http.get(f"/jobs/{jobs.done}")
    finally:
        await http.close()
    assert response.status_code == 500
    assert "a bug" not in response.text
    assert "content-security-policy" in response.headers


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/jobs/{id}"),
        ("GET", "/jobs/{id}/live"),
        ("POST", "/jobs/{id}/replay"),
        ("POST", "/jobs/{id}/cancel"),
        ("POST", "/jobs/{id}/skip"),
    ],
)
async def test_a_job_id_longer_than_any_job_id_is_not_found(
    browser: Browser, jobs: Jobs, method: str, path: str
) -> None:
    """``int()`` refuses more than 4,300 digits: routing must not call it on them
    (it was a bare 500 without our headers)."""
    for job_id in ("9" * 4301, "9" * 20):
        url = path.format(id=job_id)
        response = await (browser.get(url) if method == "GET" else browser.post(url))
        assert response.status_code == 404, (url[-20:], response.status_code)
        assert response.headers["content-security-policy"]


async def test_an_error_outside_every_handler_still_has_the_headers(make_app: AppFactory) -> None:
    """Starlette's own 500 (an error in routing, before any handler of ours runs)
    carries the security headers too."""
    app = make_app()

    async def broken(request: Request) -> Response:
        raise RuntimeError("a bug outside the handlers")

    app.router.routes.append(Route("/broken", broken))
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url=BASE) as http:
        response = await http.get("/broken")
    assert response.status_code == 500
    assert "a bug" not in response.text
    assert response.headers["content-security-policy"]
    assert response.headers["x-frame-options"] == "DENY"


async def test_tokens_and_cookies_of_any_text_are_refused_cleanly(
    make_app: AppFactory, jobs: Jobs, queue: leaseq.Queue
) -> None:
    """A form token, flash cookie or login cookie that is not ASCII is a refusal (or
    a cookie ignored) on a page of the dashboard with its headers, never a crash;
    nothing is written."""
    browser = Browser(make_app())
    try:
        refused = await browser.post(f"/jobs/{jobs.failed[0]}/replay", {"csrf": "é"})
        assert refused.status_code == 403
        assert "security token" in text_of(refused.text)
        assert "content-security-policy" in refused.headers
        session = browser.http.cookies["leaseq_session"]
        for flash in ("abc.é", "é", "²."):
            cookie = f"leaseq_session={session}; leaseq_flash={flash}".encode()
            page = await browser.get("/", headers={b"cookie": cookie})
            assert page.status_code == 200, flash
            assert "content-security-policy" in page.headers
    finally:
        await browser.close()
    _still_failed(queue, jobs)
    signed_in = Browser(make_app(auth=TokenAuth(TOKEN)))
    try:
        for login in ("1700000000.é", "²²².abc", "é"):
            page = await signed_in.get("/", headers={b"cookie": f"leaseq_login={login}".encode()})
            assert page.status_code == 401, login
            assert 'name="token"' in page.text  # the login form, not a crash
            assert "content-security-policy" in page.headers
    finally:
        await signed_in.close()


async def test_allowed_hosts_refuse_a_rebound_name(
    make_app: AppFactory, jobs: Jobs, queue: leaseq.Queue
) -> None:
    """DNS rebinding: a page of attacker.example, its name pointed at 127.0.0.1,
    sends the dashboard requests that carry its own Host and Origin, so the
    origin checks pass. Only the Host names allowed are answered."""
    app = make_app(allowed_hosts=["localhost", "127.0.0.1", "::1"])
    for base in ("http://localhost:8080", "http://127.0.0.1", "http://[::1]:8080"):
        local = Browser(app, base_url=base)
        try:
            assert (await local.get("/")).status_code == 200, base
        finally:
            await local.close()
    rebound = Browser(app, base_url="http://attacker.example:8080")
    try:
        page = await rebound.get("/")
        assert page.status_code == 400
        assert "content-security-policy" in page.headers
        action = await rebound.http.post(
            f"/jobs/{jobs.failed[0]}/replay",
            headers={"origin": "http://attacker.example:8080"},
        )
        assert action.status_code == 400
    finally:
        await rebound.close()
    _still_failed(queue, jobs)
    with pytest.raises(leaseq.InvalidArgument):
        make_app(allowed_hosts="localhost")


def _same_site(set_cookie_headers: list[str]) -> dict[str, str]:
    """Each cookie's SameSite as the responses set it (lax when not said)."""
    found: dict[str, str] = {}
    for header in set_cookie_headers:
        name = header.partition("=")[0]
        match = re.search(r"samesite=(\w+)", header, re.IGNORECASE)
        found[name] = match[1].lower() if match else "lax"
    return found


async def test_a_link_from_another_site_leaves_the_open_pages_forms_working(
    browser: Browser, jobs: Jobs, queue: leaseq.Queue
) -> None:
    """An operator has the dashboard open (tab A), then follows a link to one of its
    pages from a chat or an alert e-mail (tab B). A top-level navigation from
    another site carries only the cookies that are not SameSite=Strict; what its
    response sets, the browser keeps. Tab A's buttons must still work."""
    first = await browser.get("/")
    tab_a = re.search(r'name="csrf" value="([0-9a-f]+)"', first.text)
    assert tab_a is not None
    same_site = _same_site(first.headers.get_list("set-cookie"))
    carried = {
        name: value
        for name, value in browser.http.cookies.items()
        if same_site.get(name, "lax") != "strict"
    }
    transport = httpx.ASGITransport(app=browser.app)
    async with httpx.AsyncClient(transport=transport, base_url=BASE, cookies=carried) as link:
        tab_b = await link.get(f"/jobs/{jobs.failed[0]}", headers={"sec-fetch-site": "cross-site"})
    assert tab_b.status_code == 200
    for name, value in tab_b.cookies.items():  # the browser keeps what tab B's page set
        browser.http.cookies.set(name, value)
    clicked = await browser.post(f"/jobs/{jobs.failed[0]}/replay", {"csrf": tab_a[1]})
    assert clicked.status_code == 303, text_of(clicked.text)
    assert queue.get(jobs.failed[0]).status is JobStatus.QUEUED


async def test_a_token_of_any_characters_works_as_a_bearer_token(
    make_app: AppFactory, jobs: Jobs
) -> None:
    """``LEASEQ_DASHBOARD_TOKEN`` may hold any characters: what signs a browser in
    through the form must authenticate a client that sends it as ``Bearer`` too
    (HTTP carries it as its UTF-8 bytes)."""
    token = "pässwörd-für-die-queue"
    app = make_app(auth=TokenAuth(token))
    header = b"Bearer " + token.encode()
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url=BASE) as http:
        assert (await http.get("/", headers={b"authorization": header})).status_code == 200
        wrong = b"Bearer " + "pässwörd-für-die-queuf".encode()
        assert (await http.get("/", headers={b"authorization": wrong})).status_code == 401
    browser = Browser(app)
    try:
        assert (await browser.post("/login", {"token": token})).status_code == 303
    finally:
        await browser.close()


@pytest.mark.parametrize(
    "sent",
    [
        ("https://dash.example", "dash.example:443", "https://dash.example"),
        ("http://dash.example", "dash.example:80", "http://dash.example"),
        ("https://dash.example", "DASH.example", "https://dash.example"),
    ],
)
async def test_an_origin_differing_only_by_a_default_port_or_case_is_the_same_origin(
    make_app: AppFactory, jobs: Jobs, queue: leaseq.Queue, sent: tuple[str, str, str]
) -> None:
    """Some proxies pass on ``Host: name:443``, and browsers never write a default
    port (nor capitals) in ``Origin``: the same origin, so the operator's own
    actions must go through, while another origin is still refused."""
    base, host, origin = sent
    browser = Browser(make_app(), base_url=base)
    try:
        page = await browser.post(
            f"/jobs/{jobs.failed[0]}/replay", headers={"host": host, "origin": origin}
        )
        assert page.status_code == 303, text_of(page.text)[:300]
        assert queue.get(jobs.failed[0]).status is JobStatus.QUEUED
        other = await browser.post(
            f"/jobs/{jobs.failed[1]}/replay",
            headers={"host": host, "origin": origin.replace("dash.", "evil.")},
        )
        assert other.status_code == 403
        assert queue.get(jobs.failed[1]).status is JobStatus.FAILED
    finally:
        await browser.close()


async def test_signing_in_lands_on_the_page_asked_for(make_app: AppFactory, jobs: Jobs) -> None:
    """An operator follows an alert's link to a job, meets the login form there,
    and after signing in (even after a wrong token first) is on that job's page,
    never on another site's."""
    app = make_app(auth=TokenAuth(TOKEN))
    anonymous = Browser(app)
    try:
        asked = "/jobs?queue=reports&status=failed"
        form = await anonymous.get(asked)
        assert form.status_code == 401
        sent = re.search(r'name="next" value="([^"]*)"', form.text)
        assert sent is not None, form.text
        bad = await anonymous.post("/login", {"token": "not it", "next": unescape(sent[1])})
        assert bad.status_code == 401
        again = re.search(r'name="next" value="([^"]*)"', bad.text)
        assert again is not None
        assert unescape(again[1]) == asked
        login = await anonymous.post("/login", {"token": TOKEN, "next": unescape(again[1])})
        assert login.status_code == 303
        assert login.headers["location"] == asked
        for elsewhere in ("https://evil.example/", "//evil.example", "/\\evil.example"):
            away = await Browser(app).post("/login", {"token": TOKEN, "next": elsewhere})
            assert away.headers["location"] == "/", elsewhere
    finally:
        await anonymous.close()
