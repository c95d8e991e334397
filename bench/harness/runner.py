"""Run one step: the system's adapter as a subprocess with that system's
interpreter, its JSON result read from stdout, then the exactly-once check on
what it left in its working directory. Any failure stops the whole bench."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

import psycopg
from psycopg.conninfo import conninfo_to_dict

from .ledger import ExactlyOnceError, verify
from .plan import Step
from .venvs import BENCH, python_of

LEASEQ_PYTHON = Path(sys.executable)  # the driver runs in the repo's .venv


class BenchFailed(Exception):
    pass


def interpreter(system: str) -> Path:
    return LEASEQ_PYTHON if system in ("leaseq", "raw") else python_of(system)


def run_step(step: Step, dsn: str, timeout: float = 1800) -> dict[str, Any]:
    script = BENCH / "systems" / f"{step.system}_sys.py"
    with tempfile.TemporaryDirectory(prefix="leaseq-bench-") as tmp:
        workdir = Path(tmp)
        params = {**step.params, "dsn": dsn, "workdir": str(workdir)}
        started = time.monotonic()
        try:
            proc = subprocess.run(
                [str(interpreter(step.system)), str(script), "case", json.dumps(params)],
                capture_output=True,
                text=True,
                timeout=timeout,
                check=False,
            )
        except subprocess.TimeoutExpired as error:
            raise BenchFailed(f"{step.label}: no answer after {timeout:.0f}s") from error
        if proc.returncode != 0:
            raise BenchFailed(
                f"{step.label}: the adapter exited with {proc.returncode}\n{proc.stderr[-3000:]}"
            )
        try:
            result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
        except (IndexError, json.JSONDecodeError) as error:
            raise BenchFailed(f"{step.label}: no JSON result in\n{proc.stdout[-2000:]}") from error
        try:
            result["exactly_once"] = verify(workdir)
        except ExactlyOnceError as error:
            raise BenchFailed(f"{step.label}: EXACTLY-ONCE VIOLATED: {error}") from error
        result["wall_s"] = time.monotonic() - started
        return result


def drop_bench_schemas(dsn: str) -> None:
    """Every schema the systems and their backlogs used: a clean slate before and
    after the bench (they all start with bench_)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT nspname FROM pg_namespace WHERE nspname LIKE 'bench\\_%'"
        ).fetchall()
        for (schema,) in rows:
            conn.execute(f'DROP SCHEMA "{schema}" CASCADE')


def as_url(conninfo: str, dbname: str) -> str:
    """A postgresql:// URL of `conninfo` on database `dbname`: asyncpg (pgqueuer's
    driver) takes URLs only, psycopg takes both."""
    params = conninfo_to_dict(conninfo)
    params["dbname"] = dbname
    user = quote(str(params.pop("user", "")), safe="")
    password = params.pop("password", None)
    auth = f"{user}:{quote(str(password), safe='')}@" if password else (f"{user}@" if user else "")
    host = str(params.pop("host", "localhost"))
    port = params.pop("port", None)
    netloc = (
        f"[{host}]" if ":" in host else (quote(host, safe="") if host.startswith("/") else host)
    )
    if host.startswith("/"):  # a socket directory (and its port) go in the query
        params["host"], netloc = host, ""
        if port:
            params["port"], port = port, None
    path = quote(str(params.pop("dbname")), safe="")
    query = urlencode({k: str(v) for k, v in params.items()})
    return f"postgresql://{auth}{netloc}{':' + str(port) if port else ''}/{path}" + (
        f"?{query}" if query else ""
    )


def ensure_database(url: str, name: str) -> str:
    """The URL of database `name` on the server of `url`, created if missing, so
    the bench never touches the database test suites use."""
    with psycopg.connect(url, autocommit=True) as conn:
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone()
        if not exists:
            conn.execute(f'CREATE DATABASE "{name}"')
    return as_url(url, name)
