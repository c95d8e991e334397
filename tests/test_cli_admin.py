"""The operator's commands as a script runs them: `leaseq reap` fails every
exhausted job (not the first batch), `leaseq prune --queue` names a mistyped
queue, and a usage error never prints the password of a URL typed in it."""

from __future__ import annotations

import re

import pytest
from click.testing import CliRunner

import leaseq
from leaseq import JobStatus
from leaseq._cli import cli

from .conftest import Clock
from .test_cli import Invoke, invoke

__all__ = ["invoke"]  # the fixture, used by name


# -- leaseq reap: every exhausted job, not the first thousand ---------------------------


def test_cli_reap_fails_every_exhausted_job_not_only_the_first_batch(
    invoke: Invoke, queue: leaseq.Queue, clock: Clock
) -> None:
    """`leaseq reap` says it fails the jobs with no attempts left; it failed the
    first 1,000 (reap()'s one batch) and left the rest running on expired leases,
    exit 0, as if that was all."""
    ids = queue.enqueue_many("reports", [{"n": n} for n in range(1005)], max_attempts=1)
    assert len(queue.claim("reports", limit=1005, lease=5)) == 1005
    clock.advance(10)
    output = invoke("reap").output
    assert output.startswith("failed 1005 exhausted jobs"), output[:200]
    (stats,) = queue.stats("reports")
    assert (stats.running, stats.failed) == (0, 1005)
    assert all(queue.get(job_id).status is JobStatus.FAILED for job_id in (ids[0], ids[-1]))


# -- leaseq prune --queue: a mistyped name is said, not taken for "nothing due" -------


def test_cli_prune_of_a_mistyped_queue_says_so(
    invoke: Invoke, queue: leaseq.Queue, clock: Clock
) -> None:
    """`leaseq prune --queue reprots` printed "removed 0 finished jobs" and exited 0:
    a cron job with a typo never prunes, and says all is well (replay --all-failed
    and queue configure already refuse a mistyped queue)."""
    (job_id,) = queue.enqueue_many("reports", [{}])
    queue.complete_many(queue.claim("reports"))
    clock.advance(60)
    for extra in ((), ("--dry-run",)):
        result = invoke("prune", "--queue", "reprots", "--older-than", "1s", *extra, ok=False)
        assert result.exit_code == 1, result.output
        assert "no queue named 'reprots'" in result.output
    assert queue.get(job_id).status is JobStatus.DONE
    # The right name prunes as before.
    pruned = invoke("prune", "--queue", "reports", "--older-than", "1s")
    assert "removed 1 finished jobs" in pruned.output


# -- what the CLI prints on a usage error is scrubbed too ---------------------------------

SECRET = "s3cret-pw-9b1e"
URL = f"postgresql://app:{SECRET}@db.internal:5432/app"


@pytest.mark.parametrize(
    "arguments",
    [
        pytest.param(["status", URL], id="url-without-its-option"),
        pytest.param(["replay", URL], id="url-as-a-job-id"),
        pytest.param(["prune", "--older-than", URL], id="url-as-a-duration"),
        pytest.param([URL], id="url-as-a-command"),
    ],
)
def test_usage_errors_never_print_a_password(arguments: list[str]) -> None:
    """A URL typed without its --database-url (`leaseq status $DATABASE_URL`) is a
    usage error: click echoed the argument, password and all, to the terminal or
    the CI log, past the scrubbing every other error of the CLI goes through."""
    result = CliRunner().invoke(cli, arguments)
    assert result.exit_code == 2, result.output
    assert SECRET not in result.output


def test_a_group_without_its_command_still_shows_its_help() -> None:
    """(The scrubbing above leaves click's other usage errors as they were.)"""
    result = CliRunner().invoke(cli, ["queue"])
    assert result.exit_code == 2, result.output
    assert "Commands:" in result.output
    assert "Error:" not in result.output


# -- reading commands: a mistyped queue is said, not shown as an empty one ------------


@pytest.mark.parametrize(
    "command",
    [["status"], ["status", "--json"], ["failed"], ["explain"], ["audit"], ["audit", "--json"]],
)
def test_a_read_of_a_mistyped_queue_says_so(
    invoke: Invoke, queue: leaseq.Queue, command: list[str]
) -> None:
    """`leaseq status --queue reprots --json` printed `[]` and exited 0: a script
    read the queue as idle; `failed` listed no failed jobs, `explain` judged the
    claim of a queue that does not exist. A queue that exists, even with nothing in
    it, is shown as before."""
    queue.configure_queue("reports", max_attempts=3)  # exists, holds no job
    result = invoke(*command, "--queue", "reprots", ok=False)
    assert result.exit_code == 1, result.output
    assert "no queue named 'reprots'" in result.output
    shown = invoke(*command, "--queue", "reports")
    assert "no queue named" not in shown.output


# -- queue configure: the settings shown are the settings stored ------------------------


def test_queue_configure_shows_each_setting_exactly_as_it_reads_it_back(
    invoke: Invoke, queue: leaseq.Queue
) -> None:
    """Durations were printed with %g: a stored 1,000,001 s retention showed as
    `1e+06s` (another value, and one the same option refused as input: exit 2),
    1234.5678 s as `1234.57s`, a 1,234,567.5 s backoff cap as `1.23457e+06s`."""
    shown = invoke(
        "queue", "configure", "reports",
        "--retain-done", "1000001",
        "--retain-failed", "1234.5678s",
        "--backoff-cap", "1234567.5",
        "--lease", "45.25",
        "--rate-limit", "7/1000001s",
    ).output  # fmt: skip
    printed = dict(re.findall(r"(\w+)=(\S+)", shown))
    assert printed["retain_done"] == "1000001s"
    assert printed["retain_failed"] == "1234.5678s"
    assert printed["backoff"].endswith("..1234567.5s")
    assert printed["lease"] == "45.25s"
    assert printed["rate_limit"] == "7/1000001s"
    before = queue.queue_settings("reports")
    # Typed back as printed, each is read as the value it was (the lease and the
    # backoff are given in seconds, without the unit).
    invoke(
        "queue", "configure", "reports",
        "--retain-done", printed["retain_done"],
        "--retain-failed", printed["retain_failed"],
        "--backoff-cap", printed["backoff"].split("..")[1].removesuffix("s"),
        "--lease", printed["lease"].removesuffix("s"),
        "--rate-limit", printed["rate_limit"],
    )  # fmt: skip
    assert queue.queue_settings("reports") == before
