"""The `leaseq` command end to end (the worker command: test_worker_processes.py)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from click.testing import CliRunner, Result

import leaseq
from leaseq import JobStatus
from leaseq._cli import cli

Invoke = Callable[..., Result]


@pytest.fixture
def invoke(database_url: str, schema: str) -> Invoke:
    runner = CliRunner()

    def run(*arguments: str, ok: bool = True) -> Result:
        result = runner.invoke(
            cli,
            [*arguments, "--database-url", database_url, "--schema", schema],
            catch_exceptions=False,
        )
        if ok:
            assert result.exit_code == 0, result.output
        return result

    return run


def test_migrate_enqueue_status(invoke: Invoke, queue: leaseq.Queue) -> None:
    assert "up to date" in invoke("migrate").output
    job_id = int(invoke("enqueue", "reports", '{"report_id": 1}', "--priority", "5").output)
    invoke("enqueue", "reports", "{}", "--delay", "60", "--key", "k", "--seq", "2")
    job = queue.get(job_id)
    assert (job.payload, job.priority) == ({"report_id": 1}, 5)
    (status,) = json.loads(invoke("status", "--json").output)
    assert status["queue"] == "reports"
    assert (status["queued"], status["running"], status["failed"]) == (2, 0, 0)
    assert status["queued_bytes"] == len('{"report_id":1}') + 2
    assert status["oldest_ready_age"] >= 0
    table = invoke("status").output
    assert "reports" in table
    assert "queued" in table


def test_failed_replay_cancel_and_reap(invoke: Invoke, queue: leaseq.Queue, clock: object) -> None:
    ids = queue.enqueue_many("reports", [{"n": n} for n in range(3)], max_attempts=1)
    claims = queue.claim("reports", limit=3, lease=5)
    queue.fail(claims[0], "customer not found")
    queue.fail(claims[1], "template missing")
    clock.advance(6)  # type: ignore[attr-defined]
    assert "failed 1 exhausted jobs" in invoke("reap").output
    listing = invoke("failed").output
    assert "customer not found" in listing
    assert "template missing" in listing
    assert str(ids[2]) in listing
    assert f"replayed job {ids[0]}" in invoke("replay", str(ids[0])).output
    assert queue.get(ids[0]).status is JobStatus.QUEUED
    assert "replayed 2 jobs" in invoke("replay", "--queue", "reports", "--all-failed").output
    assert f"cancelled job {ids[1]}" in invoke("cancel", str(ids[1])).output
    assert queue.get(ids[1]).status is JobStatus.CANCELLED


@pytest.mark.parametrize("width", [100, 200])
def test_status_never_cuts_a_number_short_for_a_long_queue_name(
    invoke: Invoke, queue: leaseq.Queue, monkeypatch: pytest.MonkeyPatch, width: int
) -> None:
    """Queue names may be 128 characters: rich shrank the numbers ("12…") to keep
    such a name on one line, and dropped the number columns at 100 columns."""
    monkeypatch.setattr(leaseq._cli.common.console, "width", width)
    long_name = "reports-" + "x" * 120
    queue.enqueue_many(long_name, [{"n": n} for n in range(1234)])
    queue.enqueue_many("mail", [{"padding": "y" * 200}] * 5)
    (long_stats,) = queue.stats(long_name)
    (mail_stats,) = queue.stats("mail")
    output = invoke("status").output
    assert "…" not in output
    assert long_stats.counts[JobStatus.QUEUED] == 1234
    for number in (1234, long_stats.queued_bytes, 5, mail_stats.queued_bytes):
        assert re.search(rf"(?<![\d~]){number}(?!\d)", output), (number, output)
    assert output.count("x") >= 120  # the name folded onto more lines, not cut


def test_queue_configure(invoke: Invoke, queue: leaseq.Queue) -> None:
    output = invoke(
        "queue",
        "configure",
        "reports",
        "--max-attempts",
        "4",
        "--max-queued",
        "2",
        "--ordering-policy",
        "continue",
        "--lease",
        "30",
        "--pause",
    ).output
    assert "max_attempts=4" in output
    settings = queue.queue_settings("reports")
    assert settings is not None
    assert (settings.max_attempts, settings.max_queued_jobs, settings.lease) == (4, 2, 30)
    assert settings.paused
    invoke("queue", "configure", "reports", "--resume")
    assert not queue.queue_settings("reports").paused  # type: ignore[union-attr]
    invoke("enqueue", "reports", "{}")
    invoke("enqueue", "reports", "{}")
    full = invoke("enqueue", "reports", "{}", ok=False)
    assert full.exit_code == 1
    assert full.output.startswith("error: queue reports is full: 2 unfinished jobs, limit 2")


def test_queue_limits_and_groups(invoke: Invoke, queue: leaseq.Queue) -> None:
    output = invoke(
        "queue",
        "configure",
        "mail",
        "--max-running",
        "5",
        "--max-running-per-group",
        "2",
        "--rate-limit",
        "50/1s",
        "--rate-limit-per-group",
        "1000/1h",
    ).output
    assert "max_running=5 max_running_per_group=2 rate_limit=50/1s" in output
    assert "rate_limit_per_group=1000/1h" in output
    settings = queue.queue_settings("mail")
    assert settings is not None
    assert (settings.max_running, settings.max_running_per_group) == (5, 2)
    assert (settings.rate_limit, settings.rate_limit_per_group) == ((50, 1.0), (1000, 3600.0))
    invoke("queue", "configure", "mail", "--max-running", "none", "--rate-limit", "none")
    settings = queue.queue_settings("mail")
    assert settings is not None
    assert (settings.max_running, settings.rate_limit) == (None, None)
    for bad in (
        ("--max-running", "five"),
        ("--rate-limit", "50 per second"),
        ("--rate-limit", "x/1s"),
        ("--rate-limit", "50/"),  # a period left out is not "per second"
        ("--rate-limit", "50/ "),
    ):
        refused = invoke("queue", "configure", "mail", *bad, ok=False)
        assert refused.exit_code == 2, refused.output
    refused = invoke("queue", "configure", "mail", "--max-running", "0", ok=False)
    assert refused.exit_code == 1
    assert "max_running" in refused.output
    job_id = int(invoke("enqueue", "mail", "{}", "--group", "tenant-7").output)
    assert queue.get(job_id).group == "tenant-7"


def _leaseq(*arguments: str, database_url: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "leaseq", *arguments],
        env={**os.environ, "DATABASE_URL": database_url, **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (("enqueue", "reports", "{not json"), "error: payload is not valid JSON"),
        (("enqueue", "bad queue!", "{}"), "error: queue name must be"),
        (("enqueue", "reports", "{}", "--delay", "-5"), "error: delay must be >= 0"),
        (("replay",), "error: give a JOB_ID, or --queue Q --all-failed"),
        (("cancel", "424242"), "error: no job 424242"),
        (("queue", "configure", "reports", "--max-attempts", "0"), "error: max_attempts must"),
    ],
)
def test_errors_are_one_clear_line(
    database_url: str, queue: leaseq.Queue, arguments: tuple[str, ...], message: str
) -> None:
    result = _leaseq(*arguments, "--schema", queue.schema, database_url=database_url)
    assert result.returncode == 1, result
    assert result.stderr.startswith(message), result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert queue.stats() == []  # nothing was written


def test_unreachable_database_is_one_clear_line() -> None:
    result = _leaseq("status", database_url="postgresql://postgres@127.0.0.1:1/nowhere")
    assert result.returncode == 1
    assert result.stderr.startswith("error: cannot connect to the database")
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr


@pytest.mark.parametrize(
    "url",
    [
        "notaurl",
        "postgresql://postgres:pa%zzss@127.0.0.1/postgres",  # libpq quotes the bad token
        "postgresql://postgres:s3cret@127.0.0.1/postgres?bogus=1",
    ],
)
@pytest.mark.parametrize("command", ["status", "maintenance"])
def test_a_malformed_database_url_is_one_clear_line_at_once(url: str, command: str) -> None:
    """libpq refuses it as it parses it (no pool tried for ~6 s first), and no
    password. `leaseq maintenance` tried it again every few seconds, for ever."""
    result = _leaseq(command, database_url=url)
    assert result.returncode == 1, result
    assert result.stderr.startswith(
        "error: cannot connect to the database: invalid database URL: "
    ), result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    for secret in ("pa%zzss", "s3cret"):
        assert secret not in result.stderr


def test_unmigrated_schema_is_one_clear_line(database_url: str) -> None:
    result = _leaseq("status", "--schema", "not_migrated_yet", database_url=database_url)
    assert result.returncode == 1
    assert "leaseq migrate" in result.stderr


@pytest.mark.parametrize(
    "arguments",
    [
        ("maintenance",),
        ("worker", "tests.worker_app:app"),
        ("worker", "tests.worker_app:app", "-p", "2"),
    ],
)
def test_an_unknown_log_level_is_one_clear_line(
    database_url: str, schema: str, arguments: tuple[str, ...]
) -> None:
    result = _leaseq(
        *arguments, "--schema", schema, database_url=database_url, LEASEQ_LOG_LEVEL="bogus"
    )
    assert result.returncode == 1, result
    assert result.stderr.startswith("error: LEASEQ_LOG_LEVEL: unknown level 'bogus'"), result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr


def test_the_log_level_is_read_in_any_case(database_url: str, queue: leaseq.Queue) -> None:
    """`debug` as `DEBUG` (logging itself knows only the upper-case names)."""
    result = _leaseq(
        *("worker", "tests.worker_app:app", "--burst", "--no-listen", "--schema", queue.schema),
        database_url=database_url,
        LEASEQ_LOG_LEVEL="debug",
        LEASEQ_LOG_FORMAT="json",
    )
    assert result.returncode == 0, result.stderr
    assert '"level": "debug"' in result.stderr


@pytest.mark.parametrize("output", [(), ("--json",)])
def test_health_of_an_unmigrated_schema_is_one_clear_line(
    database_url: str, schema: str, output: tuple[str, ...]
) -> None:
    """As `status` does: exit 1, and no report (its autovacuum line claimed a job
    table that does not exist was vacuumed by autovacuum)."""
    result = _leaseq("health", *output, "--schema", schema, database_url=database_url)
    assert result.returncode == 1, result
    assert result.stderr.startswith(f"error: schema {schema!r} has no job table"), result.stderr
    assert "leaseq migrate" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert result.stdout == ""


def test_migrate_into_a_schema_it_cannot_use_is_one_clear_line(
    database_url: str, schema: str
) -> None:
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
        conn.execute(f'CREATE TABLE "{schema}".job (x int)')
    for target, message in (
        ("pg_x", "error: schema name 'pg_x' is reserved"),
        (schema, "error: cannot migrate: the schema holds objects leaseq's migrations did not"),
    ):
        result = _leaseq("migrate", "--schema", target, database_url=database_url)
        assert result.returncode == 1, result
        assert result.stderr.startswith(message), result.stderr
        assert len(result.stderr.strip().splitlines()) == 1, result.stderr


def test_health_prints_session_names_as_they_are(
    invoke: Invoke, queue: leaseq.Queue, connect: Callable[..., psycopg.Connection[Any]]
) -> None:
    """Any client sets its application_name: brackets in it are text to print, not
    markup (rich read "[/]" as a closing tag and crashed, and ate "[bold]")."""
    for name in ("[/]etl", "[bold]nightly[/bold] [red]"):
        holder = connect(autocommit=True, application_name=name)
        holder.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        holder.execute("SELECT 1")  # holds a snapshot: it holds back cleanup
        result = invoke("health")
        holder.execute("ROLLBACK")
        assert f"pid {holder.info.backend_pid} ({name})" in result.output


@pytest.mark.parametrize(
    ("option", "setting"),
    [
        ("--max-queued", "max_queued_jobs"),
        ("--max-queued-bytes", "max_queued_bytes"),
        ("--max-payload-bytes", "max_payload_bytes"),
        ("--max-running", "max_running"),
    ],
)
def test_none_lifts_a_limit(invoke: Invoke, queue: leaseq.Queue, option: str, setting: str) -> None:
    invoke("queue", "configure", "mail", option, "100")
    assert getattr(queue.queue_settings("mail"), setting) == 100
    invoke("queue", "configure", "mail", option, "none")
    assert getattr(queue.queue_settings("mail"), setting) is None


def test_queue_configure_without_settings_shows_and_makes_no_queue(
    invoke: Invoke, queue: leaseq.Queue
) -> None:
    """A mistyped name (`reprots`) made a queue, which then showed in every
    listing and gauge for good."""
    refused = invoke("queue", "configure", "reprots", ok=False)
    assert refused.exit_code == 1
    assert refused.output.startswith("error: no queue named 'reprots'"), refused.output
    assert queue.queue_settings("reprots") is None
    assert [s.queue for s in queue.stats()] == []
    queue.enqueue("reports", {})
    before = queue.audit_log()
    shown = invoke("queue", "configure", "reports").output
    assert shown.startswith("queue reports: lease=60s max_attempts=20"), shown
    assert queue.audit_log() == before


def test_queue_configure_prints_absent_limits_as_none(invoke: Invoke, queue: leaseq.Queue) -> None:
    """No limit reads `none`, the word the options take to lift one: not `never`
    (which read as "never runs") and not Python's `None`. Retention that never
    expires stays `never`."""
    output = invoke("queue", "configure", "mail", "--retain-failed", "never").output
    for limit in (
        "max_queued",
        "max_queued_bytes",
        "max_payload_bytes",
        "max_running",
        "max_running_per_group",
        "rate_limit",
        "rate_limit_per_group",
    ):
        assert f" {limit}=none" in output, output
    assert "=None" not in output
    assert "retain_failed=never" in output
    output = invoke("queue", "configure", "mail", "--max-running", "3", "--max-queued", "7").output
    assert " max_running=3 " in output
    assert " max_queued=7 " in output
    lifted = invoke("queue", "configure", "mail", "--max-running", "none").output
    assert " max_running=none " in lifted


@pytest.mark.parametrize(
    "arguments",
    [
        ("--max-running", "²"),
        ("--max-running", "٣"),
        ("--rate-limit", "²/1s"),
        ("--max-queued", "²"),
        ("--max-payload-bytes", "٣"),
        ("--retain-done", "٣d"),
    ],
)
def test_a_number_in_other_digits_is_a_usage_error(
    invoke: Invoke, queue: leaseq.Queue, arguments: tuple[str, ...]
) -> None:
    """Only ASCII digits make a number: '²' (which int() refuses) and '٣' (which it
    reads as 3) get a usage error naming the option, not a traceback; nothing is
    written."""
    result = invoke("queue", "configure", "mail", *arguments, ok=False)
    assert result.exit_code == 2, result.output
    assert f"Invalid value for '{arguments[0]}'" in result.output
    assert queue.queue_settings("mail") is None


def test_replay_of_one_job_refuses_a_queue(invoke: Invoke, queue: leaseq.Queue) -> None:
    """--queue selects --all-failed's jobs; given with a JOB_ID it would look like a
    check of the job's queue that nothing makes: refused, nothing replayed."""
    (job_id,) = queue.enqueue_many("reports", [{}], max_attempts=1)
    (claim,) = queue.claim("reports")
    queue.fail(claim, "boom")
    result = invoke("replay", str(job_id), "--queue", "emails", ok=False)
    assert result.exit_code == 1
    assert "error: --queue goes with --all-failed" in result.output
    assert queue.get(job_id).status is JobStatus.FAILED


def test_replay_of_a_mistyped_queue_says_so(invoke: Invoke, queue: leaseq.Queue) -> None:
    """It printed "replayed 0 jobs" and exited 0, as for a queue with no failure."""
    queue.enqueue("reports", {})
    result = invoke("replay", "--queue", "reprots", "--all-failed", ok=False)
    assert result.exit_code == 1
    assert "error: no queue named 'reprots'" in result.output
    assert "replayed 0 jobs" in invoke("replay", "--queue", "reports", "--all-failed").output


def test_replay_all_failed_leaves_out_a_job_too_large_for_its_queue_now(
    invoke: Invoke, queue: leaseq.Queue
) -> None:
    """The queue's max_queued_bytes was lowered below one failed job's payload: every
    `replay --all-failed` said "queue full" and replayed nothing, the jobs that fit
    included. Those are replayed; that one is left failed, and said to be, and its
    own replay says why, for good (not "full")."""
    big, *small = queue.enqueue_many(
        "reports", [{"blob": "x" * 200}, {"n": 1}, {"n": 2}], max_attempts=1
    )
    queue.fail_many(queue.claim("reports", limit=3), ["boom"] * 3)
    queue.configure_queue("reports", max_queued_bytes=100)
    output = invoke("replay", "--queue", "reports", "--all-failed").output
    assert "replayed 2 jobs" in output
    assert "1 failed jobs left as they were" in output
    assert "larger than the queue's limits" in output
    assert [queue.get(i).status for i in (big, *small)] == [
        JobStatus.FAILED,
        JobStatus.QUEUED,
        JobStatus.QUEUED,
    ]
    result = invoke("replay", str(big), ok=False)
    assert result.exit_code == 1
    assert "error: " in result.output
    assert "max_queued_bytes of 100 bytes" in result.output
    assert "full" not in result.output
    assert queue.get(big).status is JobStatus.FAILED


@pytest.mark.parametrize("interval", ["0", "-1", "nan"])
def test_the_maintenance_interval_is_checked_before_anything_runs(interval: str) -> None:
    """0 or less reaped in a busy loop, NaN never again."""
    result = CliRunner().invoke(cli, ["maintenance", "--interval", interval])
    assert result.exit_code == 2, result.output
    assert "Invalid value for '--interval'" in result.output


@pytest.mark.parametrize(
    "option",
    [
        ("--poll-interval", "0"),
        ("--poll-interval", "-1"),
        ("--poll-interval", "nan"),
        ("--shutdown-grace", "-1"),
        ("--shutdown-grace", "inf"),
        ("--maintenance-interval", "nan"),
        ("--lease", "-5"),
        ("--lease", "90000"),
    ],
    ids=" ".join,
)
def test_the_workers_seconds_are_checked_before_any_process_starts(
    option: tuple[str, str],
) -> None:
    """A poll interval of 0 or less claimed in a busy loop (a burst never ended);
    under --processes N a child refused by the Worker would be restarted for ever."""
    result = CliRunner().invoke(
        cli, ["worker", "tests.worker_app:app", "--processes", "2", *option]
    )
    assert result.exit_code == 2, result.output
    assert f"Invalid value for '{option[0]}'" in result.output


def test_the_maintenance_metrics_port_help_names_no_processes_option() -> None:
    """maintenance has no --processes: its --metrics-port help must not send the
    reader to one (the worker's help, which shares the option, still does)."""
    maintenance = CliRunner().invoke(cli, ["maintenance", "--help"], terminal_width=200)
    assert maintenance.exit_code == 0, maintenance.output
    assert "--metrics-port" in maintenance.output
    assert "--processes" not in maintenance.output
    assert "PORT+i" not in maintenance.output
    worker = CliRunner().invoke(cli, ["worker", "--help"], terminal_width=200)
    assert "with --processes N: PORT+i" in " ".join(worker.output.split())


@pytest.mark.parametrize(
    "option",
    [
        ("--concurrency", "0"),
        ("--concurrency", "-3"),
        ("--concurrency", "10001"),
        ("--processes", "0"),
        ("--processes", "-1"),
        ("--processes", "1025"),
    ],
    ids=" ".join,
)
def test_the_workers_sizes_are_checked_before_anything_runs(
    option: tuple[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """--concurrency 0 was refused only by the Worker, after the app's import: exit 1,
    and under --processes once per child (exit 78); --processes 100000 forked away.
    A usage error naming the option instead, before the app is even loaded."""
    from leaseq._cli import running

    loaded: list[str] = []
    monkeypatch.setattr(running, "load_app", loaded.append)
    result = CliRunner().invoke(cli, ["worker", "tests.worker_app:app", *option])
    assert result.exit_code == 2, result.output
    assert f"Invalid value for '{option[0]}'" in result.output
    assert loaded == []


@pytest.mark.parametrize(
    "option",
    [
        ("--requests", "0"),
        ("--requests", "-5"),
        ("--processes", "0"),
        ("--concurrency", "0"),
        ("--port", "-1"),
        ("--port", "99999"),
    ],
    ids=" ".join,
)
def test_the_demos_options_are_checked_before_anything_runs(
    option: tuple[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """--processes 0 --once never ended (no worker ran the burst), --concurrency 0
    ended in "worker 0 did not start", --port 99999 in an OverflowError, and
    --requests -5 in CHECKS FAILED: a usage error naming the option instead."""
    from leaseq.demo import run

    started: list[dict[str, Any]] = []
    monkeypatch.setattr(run, "run_demo", lambda *args, **kwargs: started.append(kwargs) or 0)
    result = CliRunner().invoke(cli, ["demo", "--once", *option])
    assert result.exit_code == 2, result.output
    assert f"Invalid value for '{option[0]}'" in result.output
    assert started == []
