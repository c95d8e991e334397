"""What the dashboard's tests share: a schema holding jobs in every state in two
queues, the app on it, an HTTP client, and helpers to post forms like a browser
(with the session's CSRF token) and to read pages."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from html import unescape
from html.parser import HTMLParser
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette

import leaseq
from leaseq.web import create_app

BASE = "http://dash.test"
SECRET_VALUE = "hunter2"


@dataclass
class Jobs:
    """The ids of the populated schema's jobs, by what they are."""

    queued: int
    secret: int
    running: int
    done: int
    failed: tuple[int, ...]
    cancelled: int
    blocked_head: int
    blocked_waiting: tuple[int, ...]
    running_claim: leaseq.Claim


def populate(queue: leaseq.Queue) -> Jobs:
    """Two queues: ``reports`` with queued, running, done, failed (two errors) and
    cancelled jobs; ``emails`` with a key blocked by its failed head."""
    secret = queue.enqueue(
        "reports", {"customer": "acme", "password": SECRET_VALUE, "auth": {"api_key": "k-123"}}
    )
    run_id = queue.enqueue("reports", {"customer": "initech"})
    done_id = queue.enqueue("reports", {"customer": "globex"})
    failed_ids = queue.enqueue_many(
        "reports", [{"customer": "acme", "n": n} for n in range(3)], max_attempts=1
    )
    cancelled = queue.enqueue("reports", {"customer": "umbrella"})
    claims = {c.job_id: c for c in queue.claim("reports", limit=10, lease=300)}
    queue.complete(claims.pop(done_id))
    queue.fail(claims.pop(failed_ids[0]), "template missing")
    queue.fail(claims.pop(failed_ids[1]), "template missing")
    queue.fail(claims.pop(failed_ids[2]), "customer not found")
    running = claims.pop(run_id)
    for claim in claims.values():  # give the rest back, claimable again
        queue.release_many([claim])
    assert queue.cancel(cancelled)
    queued = queue.enqueue("reports", {"customer": "hooli"}, key="hooli", seq=1)

    queue.configure_queue("emails", ordering_policy="block", max_queued_jobs=100)
    head, *waiting = queue.enqueue_many(
        "emails", [{"to": f"a{n}@example.com"} for n in range(3)], key="cust-1", seqs=[1, 2, 3]
    )
    (head_claim,) = queue.claim("emails")
    assert head_claim.job_id == head
    queue.fail(head_claim, "smtp refused")
    return Jobs(
        queued=queued,
        secret=secret,
        running=run_id,
        done=done_id,
        failed=tuple(failed_ids),
        cancelled=cancelled,
        blocked_head=head,
        blocked_waiting=tuple(waiting),
        running_claim=running,
    )


@pytest.fixture
def jobs(queue: leaseq.Queue) -> Jobs:
    return populate(queue)


AppFactory = Callable[..., Starlette]


@pytest.fixture
async def make_app(database_url: str, schema: str) -> AsyncIterator[AppFactory]:
    """``create_app`` on the test's schema; its client closed after the test."""
    made: list[Starlette] = []

    def make(**options: Any) -> Starlette:
        app = create_app(database_url, schema=schema, **options)
        made.append(app)
        return app

    yield make
    for app in made:
        await app.state.leaseq.client.close()


class Browser:
    """An httpx client that keeps cookies and posts forms with the page's token."""

    def __init__(self, app: Starlette, **options: Any) -> None:
        self.app = app
        self.http = httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), **{"base_url": BASE, **options}
        )

    async def get(self, path: str, **options: Any) -> httpx.Response:
        return await self.http.get(path, **options)

    async def token(self, path: str = "/") -> str:
        """The CSRF token of the forms on ``path`` (loading it starts the session)."""
        page = await self.get(path)
        match = re.search(r'name="csrf" value="([0-9a-f]+)"', page.text)
        if match:
            return match[1]
        # A page without forms (read-only, no permission): the session's token as
        # the app would put in a form.
        session = self.http.cookies.get("leaseq_session")
        assert session, f"no session on {path}: {page.status_code} {page.text[:300]}"
        token: str = self.app.state.leaseq.csrf.token(session)
        return token

    async def post(
        self,
        path: str,
        data: dict[str, str] | None = None,
        *,
        csrf: bool = True,
        headers: dict[str, str] | None = None,
    ) -> httpx.Response:
        form = dict(data or {})
        if csrf and "csrf" not in form:
            form["csrf"] = await self.token()
        sent = {"origin": BASE, "sec-fetch-site": "same-origin", **(headers or {})}
        return await self.http.post(path, data=form, headers=sent)

    async def follow(self, response: httpx.Response) -> httpx.Response:
        """The page a post/redirect/get lands on."""
        assert response.status_code == 303, (response.status_code, response.text[:500])
        return await self.get(response.headers["location"])

    async def close(self) -> None:
        await self.http.aclose()


@pytest.fixture
async def browser(make_app: AppFactory) -> AsyncIterator[Browser]:
    client = Browser(make_app())
    yield client
    await client.close()


class PageCheck(HTMLParser):
    """Collects what CSP forbids in a page: inline scripts, style attributes and
    elements, inline event handlers."""

    def __init__(self) -> None:
        super().__init__()
        self.problems: list[str] = []
        self._in_script = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        names = {name for name, _ in attrs}
        if tag == "script":
            if "src" not in names:
                self.problems.append("inline <script>")
            self._in_script = True
        if tag == "style":
            self.problems.append("<style> element")
        if "style" in names:
            self.problems.append(f"style= on <{tag}>")
        self.problems += [f"{n}= on <{tag}>" for n in names if n.startswith(("on", "hx-on"))]

    def handle_endtag(self, tag: str) -> None:
        if tag == "script":
            self._in_script = False

    def handle_data(self, data: str) -> None:
        if self._in_script and data.strip():
            self.problems.append("script with a body")


def csp_problems(html: str) -> list[str]:
    checker = PageCheck()
    checker.feed(html)
    return checker.problems


def text_of(html: str) -> str:
    """A page's text without tags, whitespace collapsed, for reading assertions."""
    return unescape(re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", html)))
