"""The README's examples for leaseq.testing, hooks and process handlers run as
written (in this test's schema), each in a fresh interpreter as a user runs it."""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
from pathlib import Path

from .conftest import ROOT


def _example(name: str, schema: str) -> str:
    """The code block after ``<!-- example: name -->``, moved into ``schema``."""
    readme = (ROOT / "README.md").read_text()
    match = re.search(rf"<!-- example: {name} -->\n```python\n(.*?)```", readme, re.DOTALL)
    assert match, f"no example {name!r} in the README"
    code = match.group(1)
    code = code.replace("leaseq.Queue()", f'leaseq.Queue(schema="{schema}")')
    return code.replace("leaseq.App()", f'leaseq.App(schema="{schema}")')


def _run(arguments: list[str], database_url: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *arguments],
        cwd=cwd,
        env={**os.environ, "DATABASE_URL": database_url, "PYTHONPATH": str(ROOT / "src")},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_the_testing_example_passes_under_pytest(
    database_url: str, schema: str, tmp_path: Path
) -> None:
    (tmp_path / "test_signup.py").write_text(_example("testing", schema))
    result = _run(
        ["-m", "pytest", "-q", "-p", "no:cacheprovider", "test_signup.py"], database_url, tmp_path
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 passed" in result.stdout


def test_the_hooks_example_logs_each_step(database_url: str, schema: str, tmp_path: Path) -> None:
    code = _example("hooks", schema) + (
        "\nlogging.basicConfig(level=logging.INFO, format='%(name)s %(message)s')"
        "\nfrom leaseq.testing import drain"
        f'\nqueue = leaseq.Queue(schema="{schema}")'
        "\nqueue.migrate()"
        '\nqueue.enqueue("reports", {})'
        "\ndrain(app)\n"
    )
    (tmp_path / "hooked.py").write_text(code)
    result = _run(["hooked.py"], database_url, tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    lines = [line for line in result.stderr.splitlines() if line.startswith("myapp.jobs")]
    assert [line.split()[1] for line in lines] == ["starting", "job", "job"], lines
    assert lines[-1].endswith("done: 42")


def test_the_process_example_runs_its_handlers_in_children(
    database_url: str, schema: str, tmp_path: Path
) -> None:
    (tmp_path / "digests.py").write_text(_example("process", schema))
    result = _run(["digests.py"], database_url, tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr

    def digest(text: str) -> str:
        data = text.encode()
        for _ in range(200_000):
            data = hashlib.sha256(data).digest()
        return data.hex()[:12]

    assert result.stdout.strip() == repr([digest(text) for text in "abcd"])
