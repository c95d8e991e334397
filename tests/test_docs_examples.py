"""The docs' code that no other test runs, run as written: the README's fragments
(Workers, Periodic jobs, Results, Concurrency limits, Metrics), given only the
names their sections define elsewhere (``app``, ``queue``, ``render``, ``mailer``),
and docs/dashboard.md's "Mounting it in your app". Each runs in a fresh
interpreter, in this test's schema, as a user would paste it."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import leaseq
from leaseq import JobStatus

from .conftest import ROOT


def _block_after(path: Path, heading: str, index: int = 0) -> str:
    """The ``index``-th python block of the section under ``heading``."""
    text = path.read_text()
    section = text.partition(f"\n{heading}\n")[2]
    assert section, f"no section {heading!r} in {path.name}"
    section = re.split(r"\n#{2,3} ", section, maxsplit=1)[0]  # (a "# " is a comment)
    blocks = re.findall(r"```python\n(.*?)```", section, re.DOTALL)
    return blocks[index]


def _in_schema(code: str, schema: str) -> str:
    for kind in ("Queue", "AsyncQueue", "App"):
        code = code.replace(f"leaseq.{kind}()", f'leaseq.{kind}(schema="{schema}")')
    return code


def _run(code: str, database_url: str, tmp_path: Path) -> str:
    (tmp_path / "example.py").write_text(code)
    result = subprocess.run(
        [sys.executable, "example.py"],
        cwd=tmp_path,
        env={**os.environ, "DATABASE_URL": database_url, "PYTHONPATH": str(ROOT / "src")},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def test_the_readme_fragments_run_against_the_current_api(
    database_url: str, schema: str, tmp_path: Path
) -> None:
    readme = ROOT / "README.md"
    workers = _block_after(readme, "## Workers")
    periodic = _block_after(readme, "## Periodic jobs")
    results = _block_after(readme, "## Results, unique jobs, per-job timeouts")
    limits = _block_after(readme, "## Concurrency and rate limits, groups, fair share")
    metrics = _block_after(readme, "### Metrics").replace("serve(9108)", "serve(0)")
    body = textwrap.indent(results + limits, "    ")
    code = _in_schema(
        "import asyncio, types\n"
        "render = lambda payload: 'body'\n"
        "mailer = types.SimpleNamespace(send=None)\n"
        + workers
        + periodic
        + "\nfrom leaseq.testing import adrain\n"
        "async def main() -> None:\n"
        "    queue = leaseq.AsyncQueue()\n"
        "    await queue.migrate()\n"
        "    app = leaseq.App()\n"
        "    async def drain_meanwhile() -> None:  # the worker the section assumes\n"
        "        while True:\n"
        "            await asyncio.sleep(0.1)\n"
        "            await adrain(app, queues=['reports'])\n"
        "    worker = asyncio.create_task(drain_meanwhile())\n" + body + "    worker.cancel()\n"
        "    print(await queue.queue_settings('emails'))\n"
        "    await queue.close()\n"
        "asyncio.run(main())\n"
        + metrics
        + "server.close()\nqueue.close()\nprint('metrics served')\n",
        schema,
    )
    printed = _run(code, database_url, tmp_path)
    assert "'pages': 12" in printed  # wait_result's answer
    assert "max_running=20, max_running_per_group=2, rate_limit=(50, 1.0)" in printed
    assert printed.strip().endswith("metrics served")


def test_the_dashboards_mounting_example_serves_under_its_path(
    database_url: str, schema: str, tmp_path: Path, queue: leaseq.Queue
) -> None:
    failed = queue.enqueue("reports", {}, max_attempts=1)
    (claim,) = queue.claim("reports")
    queue.fail(claim, "boom")
    example = _block_after(ROOT / "docs" / "dashboard.md", "## Mounting it in your app")
    harness = textwrap.dedent(f"""
        import re, types
        from starlette.testclient import TestClient

        def signed_in(inner, user):  # "your own sign-in": puts the user in the scope
            async def asgi(scope, receive, send):
                if scope["type"] == "http":
                    scope = {{**scope, "user": user}}
                await inner(scope, receive, send)
            return asgi

        admin = types.SimpleNamespace(name="ada", is_admin=True)
        viewer = types.SimpleNamespace(name="bob", is_admin=False)
        with TestClient(app, base_url="http://localhost") as anonymous:
            print("anonymous", anonymous.get("/ops/queue/").status_code)
        for user in (viewer, admin):
            with TestClient(signed_in(app, user), base_url="http://localhost") as browser:
                page = browser.get("/ops/queue/jobs/{failed}")
                token = re.search(r'name="csrf" value="([0-9a-f]+)"', page.text)
                csrf = token[1] if token else ""
                sent = browser.post(
                    "/ops/queue/jobs/{failed}/replay",
                    data={{"csrf": csrf}},
                    headers={{"origin": "http://localhost"}},
                    follow_redirects=False,
                )
                print(user.name, page.status_code, sent.status_code, sent.headers.get("location"))
        """)
    printed = _run(_in_schema(example, schema) + harness, database_url, tmp_path)
    assert printed.split("\n")[:3] == [
        "anonymous 401",
        "bob 200 403 None",  # read only: no replay (no form either: no token)
        f"ada 200 303 /ops/queue/jobs/{failed}",
    ]
    assert queue.get(failed).status is JobStatus.QUEUED
    (entry,) = [e for e in queue.audit_log() if e.action == "replay"]
    assert entry.actor == "dashboard:ada"
