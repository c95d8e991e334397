"""`leaseq demo` as a person uses it, in a real browser: the demo runs as `make demo`
does (its own processes, serving until stopped), on a schema of its own; the test
requests a broken report with the home page's form, finds it failed in the
dashboard, fixes the template, replays it with a click and reads the report."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from ..conftest import ROOT
from .harness import screenshot, wait_for

pytestmark = pytest.mark.slow


@contextlib.contextmanager
def running_demo(database_url: str) -> Iterator[str]:
    """`leaseq demo` (interactive: it serves until SIGTERM); yields the service's URL."""
    schema = f"leaseq_demo_browser_{uuid.uuid4().hex[:8]}"
    output = Path(tempfile.mkstemp(prefix="leaseq-demo-browser-", suffix=".log")[1])
    with output.open("w") as sink:
        demo = subprocess.Popen(
            [sys.executable, "-m", "leaseq", "demo", "--port", "0", "--requests", "15"],
            cwd=ROOT,
            env={
                **os.environ,
                "DATABASE_URL": database_url,
                "LEASEQ_DEMO_SCHEMA": schema,
                "COLUMNS": "200",
            },
            stdout=sink,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
    try:

        def serving() -> str | None:
            text = output.read_text(errors="replace")
            assert demo.poll() is None, text
            found = re.search(r"serving (http://127\.0\.0\.1:\d+)/", text)
            return found.group(1) if found else None

        url = wait_for(serving, timeout=300, what="the demo serving after its burst")
        assert "all checks hold" in output.read_text(errors="replace")
        yield url
        demo.send_signal(signal.SIGTERM)  # as Ctrl-C: it stops its workers and its service
        assert demo.wait(60) == 0, output.read_text(errors="replace")
    finally:
        if demo.poll() is None:
            demo.send_signal(signal.SIGTERM)
        try:
            demo.wait(60)
        except subprocess.TimeoutExpired:
            demo.kill()
            demo.wait(10)
        output.unlink(missing_ok=True)
        with psycopg.connect(database_url, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def _state(page: Any) -> str:
    return str(page.locator("#job-live .state").first.inner_text()).strip()


def test_request_fail_fix_and_replay_a_report(page: Any, database_url: str) -> None:
    with running_demo(database_url) as url:
        page.goto(f"{url}/")
        assert page.get_by_role("heading", level=1).inner_text().startswith("leaseq demo")
        assert page.locator("tbody tr").count() == 15  # the burst's requests
        form = page.get_by_test_id("request-form")
        form.locator("input[name=customer]").fill("acme browser")
        form.locator("input[name=period]").fill("2026-12")
        form.locator("select[name=kind]").select_option("broken")
        screenshot(page, "demo-home")
        form.get_by_role("button", name="Request report").click()
        page.wait_for_url(re.compile(r"/reports/\d+$"))
        report_url = page.url

        def failed() -> bool:
            page.reload()
            return "failed" in page.locator("table").inner_text()

        wait_for(failed, timeout=30, what="the broken report failing")
        assert "the report template is missing" in page.locator("table").inner_text()
        page.get_by_role("link", name=re.compile(r"job #\d+ in the dashboard")).click()
        page.wait_for_url(re.compile(r"/dashboard/jobs/\d+$"))
        job_url = page.url
        assert _state(page) == "failed"
        page.get_by_role("navigation").get_by_role("link", name="Failed", exact=True).click()
        page.wait_for_url(re.compile(r"/dashboard/failed$"))

        def listed_once() -> bool:
            # (count() does not wait: read once the page has loaded, again after a
            # reload while the dashboard's shared cache may still hold an older read)
            page.wait_for_load_state()
            if page.locator("tr", has_text="the report template is missing").count() == 1:
                return True
            page.reload()
            return False

        wait_for(listed_once, timeout=15, what="the failed report listed once on Failed")
        # Replaying before the fix fails again: fix the template on the demo's page first.
        page.goto(f"{url}/")
        page.get_by_test_id("template-form").get_by_role("button", name="Fix the template").click()
        page.wait_for_url(f"{url}/")
        assert "fixed" in page.get_by_test_id("template-form").inner_text()
        page.goto(job_url)
        page.get_by_role("button", name="Replay", exact=True).click()
        page.wait_for_url(job_url)
        assert "replayed" in page.get_by_role("status").inner_text()

        def done() -> bool:
            page.reload()
            return _state(page) == "done"

        wait_for(done, timeout=30, what="the replayed report done")
        page.goto(report_url)
        assert "Sales report: acme browser, 2026-12" in page.content()
        screenshot(page, "demo-report")
        page.goto(f"{url}/dashboard/")
        page.locator("section[aria-label='Queue reports']").wait_for()
        screenshot(page, "demo-dashboard-overview", full_page=False)
