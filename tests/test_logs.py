"""Structured logs: every worker line about a job names the job, and --log-format json
writes one JSON object per line, scrubbed."""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import leaseq
from leaseq import JobStatus
from leaseq._logs import JsonFormatter, get_logger
from leaseq._redact import remember_dsn

from .conftest import ROOT
from .test_worker import Running, _all_finished, _until


@pytest.fixture
def json_lines() -> Iterator[io.StringIO]:
    """What leaseq's worker logs, as --log-format json writes it."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter())
    logger = logging.getLogger("leaseq")
    previous = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    yield stream
    logger.removeHandler(handler)
    logger.setLevel(previous)


def _records(stream: io.StringIO) -> list[dict[str, object]]:
    return [json.loads(line) for line in stream.getvalue().splitlines()]


async def test_every_worker_line_about_a_job_names_it(
    aqueue: leaseq.AsyncQueue, database_url: str, schema: str, json_lines: io.StringIO
) -> None:
    app = leaseq.App(schema=schema)

    @app.task("reports", backoff=leaseq.Backoff(base=0, cap=0))
    async def flaky(job: leaseq.JobContext) -> None:
        if job.attempts == 1:
            raise ConnectionError("the report service hung up")

    job_id = await aqueue.enqueue("reports", {"n": 1})
    worker = Running(leaseq.Worker(app, dsn=database_url, concurrency=1, maintenance=False))
    await _until(lambda: _all_finished(aqueue, "reports"))
    await worker.stop()

    about_the_job = [r for r in _records(json_lines) if r.get("job_id") == job_id]
    assert about_the_job, json_lines.getvalue()
    for record in about_the_job:
        assert record["queue"] == "reports"
        assert isinstance(record["attempt"], int)
        assert isinstance(record["lease_version"], int)
        assert {"time", "level", "logger", "message"} <= record.keys()
    finished = {(r["attempt"], r["outcome"]) for r in about_the_job if "outcome" in r}
    assert finished == {(1, "retried"), (2, "done")}
    (retried,) = [r for r in about_the_job if r.get("outcome") == "retried"]
    assert retried["level"] == "info"
    assert "the report service hung up" in str(retried["error"])
    assert retried["lease_version"] == 1
    (done,) = [r for r in about_the_job if r.get("outcome") == "done"]
    assert done["lease_version"] == 2


def test_json_lines_are_scrubbed_of_secrets(json_lines: io.StringIO) -> None:
    remember_dsn("postgresql://app:s3cret-pw@db.internal/app")
    log = get_logger("leaseq.worker")
    try:
        raise RuntimeError("could not connect to postgresql://app:s3cret-pw@db.internal/app")
    except RuntimeError:
        log.exception("claim failed", extra={"error": "password s3cret-pw refused"})
    (record,) = _records(json_lines)
    assert "s3cret-pw" not in json_lines.getvalue()
    assert record["level"] == "error"
    assert "RuntimeError" in str(record["traceback"])


# -- --log-format json: what the operator asked for, whatever the app does at import --------

APP_WITH_ITS_OWN_LOGGING = """\
import logging

import leaseq

logging.basicConfig(level=logging.INFO)  # as many scripts do at import

app = leaseq.App()


@app.task("logs", max_attempts=1)
def broken(job: leaseq.JobContext) -> None:
    raise RuntimeError("the template is missing")
"""


def test_log_format_json_holds_when_the_app_configures_logging_at_import(
    queue: leaseq.Queue, database_url: str, tmp_path: Path
) -> None:
    """`leaseq worker app:app --log-format json` loaded the app (to fail early on a
    bad reference) before it set up its log handler; an app module that calls
    logging.basicConfig() at import left that a no-op: the lines came out in the
    app's plain format, not one JSON object per line for the log collector."""
    (tmp_path / "logging_app.py").write_text(APP_WITH_ITS_OWN_LOGGING)
    (job_id,) = queue.enqueue_many("logs", [{}])
    environment = {k: v for k, v in os.environ.items() if not k.endswith("DATABASE_URL")}
    environment["PYTHONPATH"] = str(ROOT / "src")
    process = subprocess.run(
        [
            sys.executable,
            "-m",
            "leaseq",
            "worker",
            "logging_app:app",
            "--burst",
            "--no-maintenance",
            "--log-format",
            "json",
            "--database-url",
            database_url,
            "--schema",
            queue.schema,
        ],
        cwd=tmp_path,
        env=environment,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert process.returncode == 0, process.stderr
    assert queue.get(job_id).status is JobStatus.FAILED
    lines = [line for line in process.stderr.splitlines() if line.strip()]
    assert lines, "the worker logged nothing"
    records = []
    for line in lines:
        try:
            records.append(json.loads(line))
        except ValueError:
            pytest.fail(f"not a JSON line: {line!r}\n{process.stderr}")
    assert any(r.get("job_id") == job_id and r.get("outcome") == "failed" for r in records)


async def test_a_failing_hooks_traceback_holds_no_payload_value(
    aqueue: leaseq.AsyncQueue, database_url: str, schema: str, json_lines: io.StringIO
) -> None:
    """A hook that fails while the handler's error is on its way out (an around_job
    exit whose metrics call fails) logs a traceback that chains that error: the
    handler's error quoting its input must be masked there as in the line about the
    attempt (README: the worker's log lines never hold the job's payload values)."""
    app = leaseq.App(schema=schema)
    secret = "card-4111-1111-1111-1111"

    @app.around_job
    @contextlib.contextmanager
    def timed(job: leaseq.JobContext) -> Iterator[None]:
        try:
            yield
        finally:
            raise ConnectionError("the metrics service hung up")

    @app.on_failure
    def report(job: leaseq.JobContext, error: object, will_retry: bool) -> None:
        raise RuntimeError("the error tracker refused it") from (
            error if isinstance(error, BaseException) else None
        )

    @app.task("payments", max_attempts=1)
    async def charge(job: leaseq.JobContext) -> None:
        raise ValueError(f"card declined: input_value={job.payload!r}")

    await aqueue.enqueue("payments", {"card": secret})
    worker = Running(leaseq.Worker(app, dsn=database_url, concurrency=1, maintenance=False))
    await _until(lambda: _all_finished(aqueue, "payments"))
    await worker.stop()

    text = json_lines.getvalue()
    hooks = [r for r in _records(json_lines) if "hook" in str(r["message"])]
    assert len(hooks) == 2, text
    assert all("card declined" in str(r.get("traceback")) for r in hooks), hooks
    assert secret not in text
