"""Test scripts that must run in a process of their own (they fork, or signal
themselves): each takes the schema as its argument and prints "ok" when what it
checks held."""

from __future__ import annotations

import os
import subprocess
import sys

from .conftest import ROOT


def run_script(name: str, schema: str, database_url: str, *, timeout: float = 120) -> None:
    """Run ``tests/<name>`` on ``schema``; fail with its output unless it said ok."""
    done = subprocess.run(
        [sys.executable, str(ROOT / "tests" / name), schema],
        env={**os.environ, "DATABASE_URL": database_url},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert (done.returncode, done.stdout.strip()) == (0, "ok"), done.stdout + done.stderr
