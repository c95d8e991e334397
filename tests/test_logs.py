"""Structured logs: every worker line about a job names the job, and --log-format json
writes one JSON object per line, scrubbed."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator

import pytest

import leaseq
from leaseq._logs import JsonFormatter, get_logger
from leaseq._redact import remember_dsn

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
