"""The README's quickstart runs as written (against the test database)."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import psycopg

from .conftest import ROOT


def test_readme_quickstart_runs(database_url: str, schema: str) -> None:
    readme = (ROOT / "README.md").read_text()
    code = re.findall(r"```python\n(.*?)```", readme, flags=re.DOTALL)[0]  # the quickstart
    # The README uses the default schema "leaseq"; run it in this test's schema
    # (and search_path) so parallel tests and a user's own data stay apart.
    code = code.replace("leaseq.Queue()", f'leaseq.Queue(schema="{schema}")')
    code = code.replace(
        "psycopg.connect(queue.dsn)",
        f"psycopg.connect(queue.dsn, options='-c search_path={schema}')",
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, "DATABASE_URL": database_url},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "QueueStats(queue='reports'" in result.stdout
    with psycopg.connect(database_url) as conn:
        (done,) = conn.execute(
            f"SELECT count(*) FROM \"{schema}\".job WHERE status = 'done'"
        ).fetchone()  # type: ignore[misc]
        (reports,) = conn.execute(f'SELECT count(*) FROM "{schema}".report').fetchone()  # type: ignore[misc]
    assert (done, reports) == (1, 1)
