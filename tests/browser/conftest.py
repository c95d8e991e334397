"""Fixtures of the browser tests: one Chromium per test process, a fresh page per
test (screenshotted when the test fails), the dashboard served on the test's
schema, and real worker processes."""

from __future__ import annotations

from collections.abc import Generator, Iterator
from typing import Any

import pytest

import leaseq
from leaseq.web import create_app

from .harness import STEP_MS, VIEWPORT, Served, Workers, chromium, safe_name, screenshot, serve
from .worker_app import TABLES


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[Any]:
    report = yield
    if report.when == "call":
        item.stash[_FAILED] = report.failed
    return report


_FAILED = pytest.StashKey[bool]()


@pytest.fixture
def browser() -> Iterator[Any]:
    """Chromium for one test. Not kept longer: while Playwright's sync API is up, its
    event loop counts as running in this thread, and the async tests that the same
    test process runs next could not start theirs."""
    with chromium() as launched:
        yield launched


@pytest.fixture
def page(browser: Any, request: pytest.FixtureRequest) -> Iterator[Any]:
    context = browser.new_context(viewport=VIEWPORT, locale="en-GB", timezone_id="UTC")
    context.set_default_timeout(STEP_MS)
    context.set_default_navigation_timeout(STEP_MS)
    opened = context.new_page()
    errors: list[str] = []
    opened.on("pageerror", lambda exc: errors.append(str(exc)))
    # Script errors and CSP violations (a refused form's 4xx page is not one).
    opened.on(
        "console",
        lambda message: (
            errors.append(message.text)
            if message.type == "error" and not message.text.startswith("Failed to load resource")
            else None
        ),
    )
    # A page's own parts (styles, scripts, icons) must all load.
    opened.on(
        "response",
        lambda response: (
            errors.append(f"{response.status} {response.url}")
            if response.status >= 400 and response.request.resource_type != "document"
            else None
        ),
    )
    try:
        yield opened
        if request.node.stash.get(_FAILED, False):
            screenshot(opened, f"FAILED-{safe_name(request.node.name)}")
        else:  # no script error, no CSP violation on any page the test saw
            assert errors == [], errors
    finally:
        context.close()


@pytest.fixture
def tables(queue: leaseq.Queue) -> leaseq.Queue:
    """The test's schema, migrated, with the worker app's tables."""
    with queue.connection() as conn:
        for statement in TABLES:
            conn.execute(statement.format(schema=queue.schema))
    return queue


@pytest.fixture
def dashboard(database_url: str, schema: str, tables: leaseq.Queue) -> Iterator[Served]:
    """The real dashboard app on the test's schema, served on a loopback port."""
    with serve(create_app(database_url, schema=schema, cache_seconds=0)) as served:
        yield served


@pytest.fixture
def workers(database_url: str, schema: str) -> Iterator[Workers]:
    started = Workers(database_url, schema)
    try:
        yield started
    finally:
        started.close()
