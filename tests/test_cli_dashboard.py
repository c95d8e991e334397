"""`leaseq dashboard`: loopback without auth, anywhere else only with auth from
the environment; and a real start serving pages."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
from typing import Any

import httpx
import pytest
import uvicorn
from click.testing import CliRunner

import leaseq
from leaseq._cli import cli
from leaseq._cli.common import CommandError
from leaseq._cli.dashboard import auth_from_environment, is_loopback
from leaseq.web import BasicAuth, TokenAuth

from .conftest import ROOT

TOKEN = "a-long-enough-test-token"


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.2", "::1", "[::1]", "localhost"])
def test_loopback_hosts(host: str) -> None:
    assert is_loopback(host)
    assert auth_from_environment(host, {}) is None


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "10.1.2.3", "dashboard.internal"])
def test_other_hosts_need_auth(host: str) -> None:
    assert not is_loopback(host)
    with pytest.raises(CommandError, match=r"refusing to serve the dashboard on .* without auth"):
        auth_from_environment(host, {})
    assert isinstance(auth_from_environment(host, {"LEASEQ_DASHBOARD_TOKEN": TOKEN}), TokenAuth)
    basic = {"LEASEQ_DASHBOARD_USER": "ops", "LEASEQ_DASHBOARD_PASSWORD": "pw"}
    assert isinstance(auth_from_environment(host, basic), BasicAuth)


def test_half_configured_auth_is_an_error() -> None:
    with pytest.raises(CommandError, match="set both"):
        auth_from_environment("127.0.0.1", {"LEASEQ_DASHBOARD_USER": "ops"})
    with pytest.raises(CommandError, match="at least 16 characters"):
        auth_from_environment("0.0.0.0", {"LEASEQ_DASHBOARD_TOKEN": "short"})


@pytest.fixture
def served(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """uvicorn.run replaced: what the command would serve (the address of the
    socket the command bound and hands over), without serving."""
    calls: list[dict[str, Any]] = []

    def run(app: Any, **kw: Any) -> None:
        with socket.socket(fileno=os.dup(kw["fd"])) as handed_over:
            calls.append({"app": app, "address": handed_over.getsockname()[:2], **kw})

    monkeypatch.setattr(uvicorn, "run", run)
    for name in ("LEASEQ_DASHBOARD_TOKEN", "LEASEQ_DASHBOARD_USER", "LEASEQ_DASHBOARD_PASSWORD"):
        monkeypatch.delenv(name, raising=False)
    return calls


def test_the_command_refuses_a_public_host_without_auth(
    served: list[dict[str, Any]], database_url: str
) -> None:
    result = CliRunner().invoke(
        cli, ["dashboard", "--host", "0.0.0.0", "--database-url", database_url]
    )
    assert result.exit_code == 1
    (line,) = result.output.strip().splitlines()
    assert line.startswith("error: refusing to serve the dashboard on 0.0.0.0 without auth")
    assert served == []


def test_the_command_says_why_a_short_token_is_refused(
    served: list[dict[str, Any]], database_url: str
) -> None:
    """docs/dashboard.md: off loopback without valid auth it refuses to start
    with one line saying why; a token too short must be that line's reason
    (never scrubbed into "LEASEQ_DASHBOARD_TOKEN: ***"), and never echoed."""
    short = "hunter2-secret"  # 14 characters
    result = CliRunner().invoke(
        cli,
        ["dashboard", "--host", "0.0.0.0", "--database-url", database_url],
        env={"LEASEQ_DASHBOARD_TOKEN": short},
    )
    assert result.exit_code == 1
    (line,) = result.output.strip().splitlines()
    assert line.startswith("error: ")
    assert "LEASEQ_DASHBOARD_TOKEN" in line
    assert "at least 16 characters" in line
    assert short not in result.output
    assert served == []


def test_the_command_starts_with_auth(
    served: list[dict[str, Any]], database_url: str, schema: str
) -> None:
    result = CliRunner().invoke(
        cli,
        [
            "dashboard",
            "--host",
            "0.0.0.0",
            "--port",
            "0",
            "--read-only",
            "--database-url",
            database_url,
            "--schema",
            schema,
        ],
        env={"LEASEQ_DASHBOARD_TOKEN": TOKEN},
    )
    assert result.exit_code == 0, result.output
    assert TOKEN not in result.output
    (call,) = served
    host, port = call["address"]
    assert host == "0.0.0.0"
    assert port != 0
    assert f"on http://0.0.0.0:{port}/" in result.output
    dashboard = call["app"].state.leaseq
    assert isinstance(dashboard.auth, TokenAuth)
    assert dashboard.read_only
    assert dashboard.client.schema == schema


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def test_the_dashboard_serves_pages(database_url: str, schema: str, queue: leaseq.Queue) -> None:
    queue.enqueue("reports", {"customer": "acme"})
    port = _free_port()
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "leaseq",
            "dashboard",
            "--port",
            str(port),
            "--database-url",
            database_url,
            "--schema",
            schema,
        ],
        cwd=ROOT,
        env={**os.environ, "LEASEQ_DASHBOARD_TOKEN": TOKEN},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                response = httpx.get(
                    f"http://127.0.0.1:{port}/", headers={"authorization": f"Bearer {TOKEN}"}
                )
                break
            except httpx.TransportError:
                assert process.poll() is None, process.communicate()[0]
                assert time.monotonic() < deadline, "the dashboard did not start"
                time.sleep(0.2)
        assert response.status_code == 200
        assert "reports" in response.text
        assert "content-security-policy" in response.headers
        assert httpx.get(f"http://127.0.0.1:{port}/").status_code == 401
    finally:
        process.terminate()
        output, _ = process.communicate(timeout=30)
    assert f"leaseq dashboard on http://127.0.0.1:{port}/ (TokenAuth)" in output
    assert TOKEN not in output


def _dashboard(*arguments: str, database_url: str, schema: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [
            *(sys.executable, "-m", "leaseq", "dashboard", *arguments),
            *("--database-url", database_url, "--schema", schema),
        ],
        cwd=ROOT,
        env={k: v for k, v in os.environ.items() if not k.startswith("LEASEQ_DASHBOARD_")},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _first_answer(process: subprocess.Popen[str], url: str) -> httpx.Response:
    """``url``'s answer once the dashboard ``process`` serves (within a minute)."""
    deadline = time.monotonic() + 60
    while True:
        try:
            return httpx.get(url)
        except httpx.TransportError:
            assert process.poll() is None, process.communicate()
            assert time.monotonic() < deadline, "the dashboard did not start"
            time.sleep(0.2)


def test_port_0_prints_the_port_it_serves_on(database_url: str, queue: leaseq.Queue) -> None:
    """Not http://127.0.0.1:0/ while it served on a port it never showed."""
    process = _dashboard("--port", "0", database_url=database_url, schema=queue.schema)
    try:
        assert process.stdout is not None
        banner = process.stdout.readline()  # printed once the port is bound
        match = re.search(r"on http://127\.0\.0\.1:(\d+)/ ", banner)
        assert match, banner
        port = int(match[1])
        assert port != 0, banner
        assert _first_answer(process, f"http://127.0.0.1:{port}/").status_code == 200
    finally:
        process.terminate()
        process.communicate(timeout=30)


def test_a_port_in_use_is_one_clear_error_and_no_banner(database_url: str, schema: str) -> None:
    """Not the "leaseq dashboard on ..., Ctrl-C stops it" banner, then uvicorn's
    "[Errno 98]" and exit 3."""
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        port = squatter.getsockname()[1]
        process = _dashboard("--port", str(port), database_url=database_url, schema=schema)
        stdout, stderr = process.communicate(timeout=60)
    assert process.returncode == 1, (stdout, stderr)
    assert stdout == ""
    assert stderr.startswith(f"error: --port: cannot serve on 127.0.0.1:{port} ("), stderr
    assert len(stderr.strip().splitlines()) == 1, stderr


async def _status(app: Any, base_url: str) -> int:
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url=base_url
    ) as client:
        return (await client.get("/")).status_code


async def test_without_auth_it_answers_only_to_loopback_names(
    served: list[dict[str, Any]], database_url: str, schema: str, queue: leaseq.Queue
) -> None:
    """No auth: a page of another site whose name points at 127.0.0.1 (DNS
    rebinding) must get nothing from it. With auth, any name: the credentials guard it."""
    arguments = ["dashboard", "--host", "127.0.0.2", "--port", "0", "--database-url", database_url]
    result = CliRunner().invoke(cli, [*arguments, "--schema", schema])
    assert result.exit_code == 0, result.output
    app = served[-1]["app"]
    try:
        for base in ("http://localhost:8080", "http://127.0.0.2:8080", "http://[::1]:8080"):
            assert await _status(app, base) == 200, base
        assert await _status(app, "http://attacker.example:8080") == 400
    finally:
        await app.state.leaseq.client.close()
    result = CliRunner().invoke(
        cli, [*arguments, "--schema", schema], env={"LEASEQ_DASHBOARD_TOKEN": TOKEN}
    )
    assert result.exit_code == 0, result.output
    app = served[-1]["app"]
    try:
        assert await _status(app, "http://dashboard.example.com") == 401  # asked to sign in
    finally:
        await app.state.leaseq.client.close()


@pytest.mark.parametrize("proxy", ["strips the prefix", "keeps the prefix"])
def test_the_dashboard_served_under_a_path_prefix_links_within_it(
    database_url: str, schema: str, queue: leaseq.Queue, proxy: str
) -> None:
    """Behind a reverse proxy at https://ops.example/queues/ (``--root-path
    /queues``): every link, form and cookie of its pages stays under the prefix,
    whether the proxy strips it from the path it forwards or keeps it."""
    job_id = queue.enqueue("reports", {"customer": "acme"})
    process = _dashboard(
        "--port", "0", "--root-path", "/queues", database_url=database_url, schema=schema
    )
    forwarded = "" if proxy == "strips the prefix" else "/queues"
    try:
        assert process.stdout is not None
        banner = process.stdout.readline()  # printed once the port is bound
        match = re.search(
            r"on http://127\.0\.0\.1:(\d+)/ \(no auth: loopback only; under /queues\)", banner
        )
        assert match, banner
        port = int(match[1])
        page = _first_answer(process, f"http://127.0.0.1:{port}{forwarded}/jobs")
        assert page.status_code == 200, page.text[:300]
        assert f'href="/queues/jobs/{job_id}"' in page.text
        links = re.findall(r'(?:href|action|src)="(/[^"]*)"', page.text)
        assert links, page.text[:300]
        assert all(link.startswith("/queues/") for link in links), links
        cookies = page.headers.get_list("set-cookie")
        assert cookies
        assert all("path=/queues" in c.lower() for c in cookies), cookies
        job = httpx.get(f"http://127.0.0.1:{port}{forwarded}/jobs/{job_id}")
        assert job.status_code == 200
        assert "acme" in job.text
        style = re.search(r'<link[^>]+href="(/queues/[^"]+\.css[^"]*)"', page.text)
        assert style is not None
        static = httpx.get(f"http://127.0.0.1:{port}{forwarded}{style[1][len('/queues') :]}")
        assert static.status_code == 200
    finally:
        process.terminate()
        process.communicate(timeout=30)


@pytest.mark.parametrize("prefix", ["queues", "/a//b", "/a/../b", "/a?b", "/a b", "/a\nb"])
def test_a_root_path_that_is_no_url_path_is_refused(prefix: str) -> None:
    result = CliRunner().invoke(cli, ["dashboard", "--root-path", prefix])
    assert result.exit_code == 2
    assert "a URL path like /queues" in result.output
