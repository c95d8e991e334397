"""`leaseq job ID` and `leaseq failed --json`: what an operator reads of a job is
its real state, never a secret of its payload, never a control for the terminal,
and, as JSON, parses, with times in UTC."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import datetime
from typing import Any

import pytest

import leaseq
from leaseq import JobStatus

from .conftest import Clock
from .test_cli import Invoke, invoke
from .test_cli_incident import HOSTILE, TERMINAL_CONTROL

__all__ = ["invoke"]  # the fixture, used by name

#: Values of secret fields, and a password inside a DSN a payload quotes: none of
#: them may be printed, in any form.
SECRETS = ("hunter2-the-password", "tok-3f9a8b7c6d5e", "dsn-pass-77x")
PAYLOAD = {
    "customer": "acme-corp",
    "password": SECRETS[0],
    "nested": [{"api_token": SECRETS[1], "region": "eu-west"}],
    "database": f"postgresql://app:{SECRETS[2]}@db.internal/app",
}


def _json(result: Any) -> Any:
    return json.loads(result.stdout)


def _utc(text: str) -> datetime:
    """An ISO 8601 time the CLI printed, which must say UTC."""
    moment = datetime.fromisoformat(text)
    offset = moment.utcoffset()
    assert offset is not None, text
    assert offset.total_seconds() == 0, text
    return moment


def _no_secret_in(output: str) -> None:
    for secret in SECRETS:
        assert secret not in output, (secret, output)


def test_job_json_holds_the_jobs_real_state_after_a_claim_and_a_failure(
    invoke: Invoke, queue: leaseq.Queue
) -> None:
    job_id = queue.enqueue(
        "reports",
        PAYLOAD,
        key="customer:acme",
        seq=3,
        priority=7,
        max_attempts=2,
        group="acme",
        unique_key="report:acme:1",
    )
    (claim,) = queue.claim("reports", lease=60)
    running = _json(invoke("job", str(job_id), "--json"))
    stored = queue.get(job_id)
    assert running["job_id"] == job_id
    assert (running["queue"], running["status"]) == ("reports", "running")
    assert (running["attempts"], running["max_attempts"]) == (1, 2)
    assert running["lease_version"] == claim.lease_version
    assert _utc(running["lease_until"]) == stored.lease_until
    assert _utc(running["claimed_at"]) == stored.claimed_at
    assert 0 < running["lease_remaining"] <= 60
    assert (running["key"], running["seq"], running["priority"]) == ("customer:acme", 3, 7)
    assert (running["group"], running["unique_key"]) == ("acme", "report:acme:1")
    assert running["payload"]["customer"] == "acme-corp"  # what is not secret is shown

    queue.fail(claim, "ValueError: the template is missing")
    failed = _json(invoke("job", str(job_id), "--json"))
    stored = queue.get(job_id)
    assert failed["status"] == "failed"
    assert failed["last_error"] == stored.last_error
    assert "template is missing" in failed["last_error"]
    assert _utc(failed["finished_at"]) == stored.finished_at
    assert failed["lease_until"] is None  # no lease is held by a failed job
    assert failed["timeline"][-1]["kind"] == "failed"
    assert failed["timeline"][-1]["error"] == stored.last_error
    (entry,) = failed["history"]
    assert (entry["outcome"], entry["lease_version"]) == ("failed", claim.lease_version)


def test_job_never_shows_a_secret_of_the_payload(invoke: Invoke, queue: leaseq.Queue) -> None:
    """Secret fields are hidden as on the dashboard's job page, at any depth, and a
    DSN quoted in a value loses its password: at the terminal and in JSON."""
    job_id = queue.enqueue("reports", PAYLOAD)
    text = invoke("job", str(job_id)).output
    as_json = invoke("job", str(job_id), "--json").output
    for output in (text, as_json):
        _no_secret_in(output)
        assert "acme-corp" in output  # the rest is there
        assert "eu-west" in output
    payload = json.loads(as_json)["payload"]
    assert set(payload) == set(PAYLOAD)  # every field named, secret ones masked


def test_job_writes_no_control_to_the_terminal_and_json_keeps_the_text(
    invoke: Invoke, queue: leaseq.Queue
) -> None:
    """A stored error quoting an attacker's answer: the terminal gets its controls
    written out; JSON holds the text as stored (JSON escapes it itself)."""
    job_id = queue.enqueue("reports", {"note": "x\x9b2J\u202eevil"}, max_attempts=2)
    queue.retry(queue.claim("reports")[0], delay=0, error=HOSTILE)
    queue.fail(queue.claim("reports")[0], HOSTILE)
    text = invoke("job", str(job_id)).output
    assert not TERMINAL_CONTROL.search(text), repr(text)
    assert "\u202e" not in text
    assert all(part in text for part in ("boom", "RED", "pwned")), text
    stored = queue.get(job_id)
    shown = _json(invoke("job", str(job_id), "--json"))
    assert shown["last_error"] == stored.last_error
    assert [e["error"] for e in shown["history"]] == [e["error"] for e in stored.history]


def test_job_says_why_a_queued_job_waits(invoke: Invoke, queue: leaseq.Queue) -> None:
    head, behind = queue.enqueue_many("reports", [{}, {}], key="k", max_attempts=1)
    queue.fail(queue.claim("reports")[0], "boom")
    blocked = _json(invoke("job", str(behind), "--json"))
    assert blocked["blocked_by"] == head
    assert any(f"#{head}" in reason for reason in blocked["waiting"]), blocked["waiting"]
    assert f"#{head}" in invoke("job", str(behind)).output

    ready = queue.enqueue("mail", {})
    assert _json(invoke("job", str(ready), "--json"))["waiting"] == []
    queue.configure_queue("mail", paused=True)
    paused = _json(invoke("job", str(ready), "--json"))["waiting"]
    assert any("paused" in reason for reason in paused), paused


def test_job_not_there_is_one_clear_line_and_exit_1(
    invoke: Invoke, queue: leaseq.Queue, clock: Clock
) -> None:
    queue.configure_queue("reports", retention_mode="archive", retain_failed=60)
    archived = queue.enqueue("reports", {}, max_attempts=1)
    queue.fail(queue.claim("reports")[0], "boom")
    clock.advance(120)
    queue.prune()
    for job_id, says in ((archived, "archive"), (424242, "retention")):
        for options in ((), ("--json",)):
            result = invoke("job", str(job_id), *options, ok=False)
            assert result.exit_code == 1, result.output
            assert result.stdout == ""  # no half answer for a script to parse
            (line,) = result.stderr.strip().splitlines()
            assert line.startswith(f"error: no job {job_id}"), line
            assert says in line, line


@pytest.mark.parametrize("typed", ["abc", "0", "1.5", "+3", "٣", "99999999999999999999"])
def test_a_bad_job_id_is_a_usage_error(invoke: Invoke, queue: leaseq.Queue, typed: str) -> None:
    result = invoke("job", typed, ok=False)
    assert result.exit_code == 2, result.output
    assert "is not a job id" in result.output


def test_job_works_without_the_web_extra(database_url: str, queue: leaseq.Queue) -> None:
    """The dashboard's mask and timeline are the CLI's too, without starlette."""
    job_id = queue.enqueue("reports", PAYLOAD)
    script = (
        "import sys; sys.modules['starlette'] = sys.modules['jinja2'] = None; "
        "from leaseq._cli import main; main()"
    )
    result = subprocess.run(
        [sys.executable, "-c", script, "job", str(job_id), "--json", "--schema", queue.schema],
        env={**os.environ, "DATABASE_URL": database_url},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["job_id"] == job_id
    _no_secret_in(result.stdout)


def test_times_are_utc_whatever_the_sessions_time_zone(
    invoke: Invoke, queue: leaseq.Queue, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The database answers in its session's TimeZone (PGTZ, a role's setting):
    `audit --json` printed +05:30 times beside `status`'s UTC-less numbers."""
    job_id = queue.enqueue("reports", {}, max_attempts=1)
    queue.fail(queue.claim("reports")[0], "boom")
    assert queue.replay(job_id, actor="ops")
    queue.fail(queue.claim("reports")[0], "boom again")
    monkeypatch.setenv("PGTZ", "Asia/Kolkata")
    shown = _json(invoke("job", str(job_id), "--json"))
    for name in ("created_at", "available_at", "claimed_at", "finished_at"):
        assert _utc(shown[name]) == getattr(queue.get(job_id), name)
    for event in shown["timeline"]:
        if event["at"] is not None:
            _utc(event["at"])
    (listed,) = _json(invoke("failed", "--json"))["jobs"]
    _utc(listed["finished_at"])
    (entry,) = _json(invoke("audit", "--json"))
    _utc(entry["at"])
    assert "+05:30" not in invoke("failed").output


def test_failed_json_lists_the_jobs_and_says_when_the_limit_cut_it(
    invoke: Invoke, queue: leaseq.Queue
) -> None:
    ids = queue.enqueue_many("reports", [{"n": n} for n in range(3)], max_attempts=1)
    claims = queue.claim("reports", limit=3)
    queue.fail_many(claims, [f"error {n}\x1b[2J" for n in range(3)])
    cut = _json(invoke("failed", "--json", "--limit", "2"))
    assert (cut["cut"], cut["total"], cut["limit"]) == (True, 3, 2)
    assert len(cut["jobs"]) == 2
    whole = _json(invoke("failed", "--json"))
    assert (whole["cut"], whole["total"]) == (False, 3)
    assert sorted(job["job_id"] for job in whole["jobs"]) == sorted(ids)
    for job in whole["jobs"]:
        stored = queue.get(job["job_id"])
        assert stored.status is JobStatus.FAILED
        assert job["last_error"] == stored.last_error  # as stored: JSON escapes it
        assert (job["attempts"], job["max_attempts"], job["queue"]) == (1, 1, "reports")
        assert _utc(job["finished_at"]) == stored.finished_at
    assert "newest of 3" in invoke("failed", "--limit", "2").output
    # Exactly the limit, and no more: not cut.
    exact = _json(invoke("failed", "--json", "--limit", "3"))
    assert (exact["cut"], exact["total"]) == (False, 3)
    assert _json(invoke("failed", "--json", "--queue", "reports"))["total"] == 3


def test_failed_json_of_an_unknown_queue_is_an_error(invoke: Invoke, queue: leaseq.Queue) -> None:
    queue.enqueue("reports", {})
    result = invoke("failed", "--json", "--queue", "reprots", ok=False)
    assert result.exit_code == 1
    assert result.stdout == ""
