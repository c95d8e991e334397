"""The operator's commands as a script runs them: `leaseq reap` fails every
exhausted job (not the first batch), `leaseq prune --queue` names a mistyped
queue, and a usage error never prints the password of a URL typed in it."""

from __future__ import annotations

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
