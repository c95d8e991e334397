"""The demo behind the README's first command, end to end, and its HTTP validation."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

import leaseq
from leaseq.demo import QUEUE, SCHEMA, run
from leaseq.demo.processes import Terminated, Workers, stop_signals
from leaseq.demo.service import create_app

from .conftest import ROOT

# The end-to-end run gets a schema of its own, apart from the in-process tests'.
E2E_SCHEMA = "leaseq_demo_e2e"
#: Every test here but the end-to-end one resets the demo's one schema (SCHEMA):
#: they run one after another, on one test process, never beside each other.
pytestmark = pytest.mark.xdist_group("demo_schema")


def _line(output: str, label: str) -> str:
    match = re.search(rf"{re.escape(label)}\s*│\s*(.+?)\s*│", output)
    assert match, f"no '{label}' line in:\n{output}"
    return match.group(1)


def test_demo_once_with_a_worker_killed_mid_burst(database_url: str) -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "leaseq",
            "demo",
            "--once",
            "--kill-worker",
            "--requests",
            "40",
            "--port",
            "0",
        ],
        cwd=ROOT,
        env={
            **os.environ,
            "DATABASE_URL": database_url,
            "LEASEQ_DEMO_SCHEMA": E2E_SCHEMA,
            "COLUMNS": "200",
        },
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    output = result.stdout
    assert result.returncode == 0, output + result.stderr
    assert "all checks hold" in output
    assert _line(output, "requests accepted (HTTP 202)") == "40 of 40"
    assert _line(output, "reports done") == "40 of 40"
    assert _line(output, "duplicate reports") == "0"
    assert _line(output, "duplicate notifications") == "0"
    assert _line(output, "ordered reports out of order") == "0"
    assert _line(output, "worker killed with SIGKILL mid-burst") == "yes"
    failed = _line(output, "failed (broken kind), then replayed after the fix")
    assert failed == "3 failed -> all done"
    assert re.fullmatch(r"http://127\.0\.0\.1:\d+/dashboard/", _line(output, "dashboard"))
    # And the database agrees, independently of the demo's own summary.
    with leaseq.Queue(database_url, schema=E2E_SCHEMA) as queue:
        (stats,) = queue.stats(QUEUE)
        assert stats.counts[leaseq.JobStatus.DONE] == 40
        with queue.connection() as conn:
            counts = conn.execute(
                f'SELECT (SELECT count(*) FROM "{E2E_SCHEMA}".report_request),'
                f' (SELECT count(*) FROM "{E2E_SCHEMA}".report)'
            ).fetchone()
            recovered = conn.execute(
                f'SELECT count(*) FROM "{E2E_SCHEMA}".job, jsonb_array_elements(history) h'
                " WHERE h ->> 'outcome' = 'lease_expired'"
            ).fetchone()
        assert counts == (40, 40)
        assert recovered is not None
        assert recovered[0] >= 1  # the killed worker's jobs came back after their leases


#: The end-to-end SIGTERM runs' schema: apart from the in-process tests' too.
SIGTERM_SCHEMA = "leaseq_demo_sigterm"


def _children(pid: int) -> set[int]:
    """The processes whose parent is ``pid`` (from /proc: Linux)."""
    found = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            # "pid (comm) state ppid ...": comm may hold spaces and parentheses.
            fields = stat.read_text().rpartition(")")[2].split()
        except OSError:  # it ended meanwhile
            continue
        if int(fields[1]) == pid:
            found.add(int(stat.parent.name))
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except OSError:
        return False
    return state != "Z"  # a zombie has ended (its new parent, init, reaps it)


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="finds children in /proc")
@pytest.mark.server_agnostic  # the demo's processes and signals
@pytest.mark.parametrize("progress", ["service: ", "submitted "])
def test_sigterm_before_serving_stops_the_service_and_the_workers(
    database_url: str, progress: str
) -> None:
    """SIGTERM once the demo printed ``progress`` (before its "press Ctrl-C"): its
    HTTP service and workers (each in a session of its own, so the signal reaches
    the demo only) must be stopped with it, not left running as orphans."""
    demo = subprocess.Popen(
        [sys.executable, "-m", "leaseq", "demo", "--once", "--requests", "40", "--port", "0"],
        cwd=ROOT,
        env={**os.environ, "DATABASE_URL": database_url, "LEASEQ_DEMO_SCHEMA": SIGTERM_SCHEMA},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    children: set[int] = set()
    try:
        assert demo.stdout is not None
        printed = []
        for line in demo.stdout:  # (ends when the demo does)
            printed.append(line)
            if line.startswith(progress):
                break
        assert printed[-1].startswith(progress), "".join(printed)
        children = _children(demo.pid)
        assert len(children) == 3, children  # uvicorn and two workers
        demo.send_signal(signal.SIGTERM)
        output = "".join(printed) + demo.communicate(timeout=120)[0]
        assert demo.returncode == 128 + signal.SIGTERM, output
        assert "Traceback" not in output
        left = {pid for pid in children if _alive(pid)}
        assert left == set(), f"left running: {left}\n{output}"
    finally:
        if demo.poll() is None:
            demo.kill()
            demo.communicate(timeout=30)
        for pid in children:
            with contextlib.suppress(OSError):
                if _alive(pid):
                    os.kill(pid, signal.SIGKILL)


def test_a_second_signal_while_workers_stop_still_stops_every_worker() -> None:
    """A SIGTERM that arrives while the first worker is being stopped comes
    after every worker got its SIGTERM (it interrupted the loop, skipping the rest)."""

    class Child:
        def __init__(self) -> None:
            self.signals: list[int] = []

        def poll(self) -> int | None:
            return None if not self.signals else 0

        def send_signal(self, signum: int) -> None:
            self.signals.append(signum)
            os.kill(os.getpid(), signal.SIGTERM)  # the second signal, now

        def wait(self, timeout: float | None = None) -> int:
            return 0

        def kill(self) -> None:
            self.signals.append(signal.SIGKILL)

    workers = Workers("postgresql://nowhere", 1, Path("."))
    children = [Child(), Child(), Child()]
    workers.processes = children  # type: ignore[assignment]
    with stop_signals(), pytest.raises(Terminated):
        workers.stop()
    assert [child.signals[:1] for child in children] == [[signal.SIGTERM]] * 3


def test_a_malformed_database_url_is_one_clear_line() -> None:
    """Not the driver's ProgrammingError traceback from the banner's "database: ..."."""
    result = subprocess.run(
        [sys.executable, "-m", "leaseq", "demo", "--once", "--port", "0"],
        cwd=ROOT,
        env={**os.environ, "DATABASE_URL": "notaurl"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 1, result.stdout + result.stderr
    assert result.stderr.startswith(
        "error: cannot connect to the database: invalid database URL: "
    ), result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr


@pytest.fixture
def client(database_url: str) -> Iterator[tuple[TestClient, leaseq.Queue]]:
    with leaseq.Queue(database_url, schema=SCHEMA) as queue:
        run.prepare(queue)
        with TestClient(create_app(database_url)) as http:
            yield http, queue


def _written(queue: leaseq.Queue) -> tuple[int, int]:
    with queue.connection() as conn:
        requests = conn.execute(f'SELECT count(*) FROM "{SCHEMA}".report_request').fetchone()
        jobs = conn.execute(f'SELECT count(*) FROM "{SCHEMA}".job').fetchone()
    assert requests is not None
    assert jobs is not None
    return int(requests[0]), int(jobs[0])


INVALID: list[tuple[Any, str]] = [
    ({"period": "2026-11", "kind": "standard"}, "customer:"),
    ({"customer": "", "period": "2026-11"}, "customer:"),
    ({"customer": "x" * 65, "period": "2026-11"}, "customer:"),
    ({"customer": "acme", "period": "2026-13"}, "period: a month as YYYY-MM"),
    ({"customer": "acme", "period": 202611}, "period: a month as YYYY-MM"),
    ({"customer": "acme", "period": "2026-11", "kind": "urgent"}, "kind: one of"),
    ({"customer": "acme", "period": "2026-11", "colour": "red"}, "unknown fields: colour"),
    (["acme", "2026-11"], "expected a JSON object"),
]


@pytest.mark.parametrize(("body", "message"), INVALID)
def test_invalid_requests_get_422_and_write_nothing(
    client: tuple[TestClient, leaseq.Queue], body: Any, message: str
) -> None:
    http, queue = client
    response = http.post("/reports", json=body)
    assert response.status_code == 422
    assert message in response.json()["error"]
    assert _written(queue) == (0, 0)


def test_malformed_json_gets_422(client: tuple[TestClient, leaseq.Queue]) -> None:
    http, queue = client
    response = http.post(
        "/reports", content=b"{not json", headers={"content-type": "application/json"}
    )
    assert response.status_code == 422
    assert response.json() == {"error": "the body is not valid JSON"}
    assert _written(queue) == (0, 0)


def test_accepted_request_and_status(client: tuple[TestClient, leaseq.Queue]) -> None:
    http, queue = client
    response = http.post("/reports", json={"customer": "acme", "period": "2026-11"})
    assert response.status_code == 202
    body = response.json()
    assert body["status_url"] == f"/reports/{body['id']}"
    assert response.headers["location"] == body["status_url"]
    assert _written(queue) == (1, 1)  # the request row and its job, together
    status = http.get(body["status_url"]).json()
    assert status["status"] == "queued"
    assert (status["attempts"], status["last_error"]) == (0, None)
    assert "report_url" not in status
    assert http.get(f"{body['status_url']}/html").status_code == 404
    page = http.get(body["status_url"], headers={"accept": "text/html"})
    assert page.headers["content-type"].startswith("text/html")
    assert "queued" in page.text
    assert http.get("/reports/999999").status_code == 404
    assert http.get("/reports/abc").status_code == 404
    assert http.get("/reports/²").status_code == 404  # isdigit(), but no int()


def test_ordered_requests_carry_their_key(client: tuple[TestClient, leaseq.Queue]) -> None:
    http, queue = client
    http.post("/reports", json={"customer": "acme", "period": "2026-02", "kind": "ordered"})
    (claim,) = queue.claim(QUEUE)
    assert (claim.key, claim.seq) == ("acme", 2026 * 12 + 2)


def test_finished_report_is_served(
    client: tuple[TestClient, leaseq.Queue], database_url: str
) -> None:
    from leaseq._worker import JobContext
    from leaseq.demo import jobs

    http, queue = client
    body = http.post("/reports", json={"customer": "acme", "period": "2026-11"}).json()
    (claim,) = queue.claim(QUEUE)
    context = JobContext(claim, queue, leaseq.AsyncQueue(database_url, schema=SCHEMA))
    jobs.generate_report(context)  # the worker's handler, run here
    assert context.completed
    status = http.get(body["status_url"]).json()
    assert status["status"] == "done"
    assert status["report_url"] == f"/reports/{body['id']}/html"
    page = http.get(body["status_url"], headers={"accept": "text/html"})
    assert "Sales report: acme, 2026-11" in page.text
    assert "<svg" in page.text
    assert page.text == http.get(status["report_url"]).text


def test_home_page_requests_a_report_with_a_form(client: tuple[TestClient, leaseq.Queue]) -> None:
    http, queue = client
    home = http.get("/")
    assert home.status_code == 200
    assert home.headers["content-type"].startswith("text/html")
    assert "No report requested yet." in home.text
    assert "href='/dashboard/'" in home.text
    form = {"customer": "acme", "period": "2026-11", "kind": "flaky"}
    response = http.post("/reports", data=form, follow_redirects=False)
    assert response.status_code == 303
    status_url = response.headers["location"]
    assert _written(queue) == (1, 1)
    page = http.get(status_url, headers={"accept": "text/html"})
    assert "queued" in page.text
    assert "flaky" in page.text
    listed = http.get("/").text
    assert f"href='{status_url}'" in listed
    assert "acme" in listed


def test_home_page_form_refuses_bad_input_and_keeps_it(
    client: tuple[TestClient, leaseq.Queue],
) -> None:
    http, queue = client
    form = {"customer": "<b>acme</b>", "period": "2026-13", "kind": "standard"}
    response = http.post("/reports", data=form)
    assert response.status_code == 422
    assert "customer:" in response.text
    assert "&lt;b&gt;acme&lt;/b&gt;" in response.text  # sent back, escaped
    assert "<b>acme" not in response.text
    assert _written(queue) == (0, 0)


def test_the_template_can_be_fixed_and_broken_from_the_home_page(
    client: tuple[TestClient, leaseq.Queue],
) -> None:
    http, _ = client
    assert "<strong>missing</strong>" in http.get("/").text
    response = http.post("/template", data={"fixed": "1"}, follow_redirects=False)
    assert (response.status_code, response.headers["location"]) == (303, "/")
    assert "<strong>fixed</strong>" in http.get("/").text
    http.post("/template", data={"fixed": "0"})
    assert "<strong>missing</strong>" in http.get("/").text


def test_cross_site_forms_are_refused(client: tuple[TestClient, leaseq.Queue]) -> None:
    http, queue = client
    form = {"customer": "acme", "period": "2026-11"}
    evil = {"origin": "http://evil.example"}
    assert http.post("/reports", data=form, headers=evil).status_code == 403
    cross = {"sec-fetch-site": "cross-site"}
    assert http.post("/reports", data=form, headers=cross).status_code == 403
    assert http.post("/template", data={"fixed": "1"}, headers=evil).status_code == 403
    assert _written(queue) == (0, 0)
    assert "<strong>missing</strong>" in http.get("/").text
    same = {"origin": "http://testserver", "sec-fetch-site": "same-origin"}
    assert http.post("/reports", data=form, headers=same, follow_redirects=False).status_code == 303


def test_the_dashboard_is_mounted(client: tuple[TestClient, leaseq.Queue]) -> None:
    http, queue = client
    http.post("/reports", json={"customer": "acme", "period": "2026-11"})
    overview = http.get("/dashboard/")
    assert overview.status_code == 200
    assert "Overview" in overview.text
    assert 'href="/dashboard/jobs"' in overview.text  # its links carry the mount's prefix
    (job,) = queue.list_jobs("queued")
    page = http.get(f"/dashboard/jobs/{job.job_id}")
    assert page.status_code == 200
    assert "acme" in page.text
