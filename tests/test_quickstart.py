"""The quickstart example behind `make demo` runs end to end."""

from __future__ import annotations

import os
import subprocess
import sys

from .conftest import ROOT


def test_quickstart_example_runs(database_url: str) -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "quickstart.py")],
        env={**os.environ, "DATABASE_URL": database_url},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "reports written: 40 (one per request, no duplicates)" in result.stdout
    assert "1 crashed mid-job and was recovered" in result.stdout
    assert result.stdout.rstrip().endswith("OK")
