"""What `leaseq health` and `leaseq explain` say where it matters most: a large
job table never analyzed, a role that may not vacuum the table it reports on,
a queue whose claim goes through claim_limited() (a plan EXPLAIN cannot show)."""

from __future__ import annotations

import time
from collections.abc import Callable

import psycopg
import pytest
from click.testing import CliRunner

import leaseq
from leaseq._cli import cli

from .roles import restricted_roles

Connect = Callable[..., psycopg.Connection[tuple[object, ...]]]


# -- leaseq health ----------------------------------------------------------------------


def test_health_says_when_a_large_job_table_was_never_analyzed(
    queue: leaseq.Queue, connect: Connect
) -> None:
    """README/_health.py: "the job table was never analyzed: the planner guesses its
    contents; run ANALYZE". The check read the table's row count from
    pg_class.reltuples, which a table never analyzed (nor vacuumed) does not have
    (-1, read as 0): the warning could never be given when it applies."""
    with connect(autocommit=True) as conn:  # no autoanalyze during the test
        conn.execute(f'ALTER TABLE "{queue.schema}".job SET (autovacuum_enabled = false)')
    for start in range(0, 20_000, 10_000):
        queue.enqueue_many("bulk", [{"n": n} for n in range(start, start + 10_000)])
    deadline = time.monotonic() + 30
    while True:  # the server's statistics lag a moment behind the inserts
        job = queue.health().table("job")
        assert job is not None
        if job.live_tuples >= 20_000:
            break
        assert time.monotonic() < deadline, job
        time.sleep(0.2)
    assert job.last_analyze is None  # never analyzed
    assert job.last_autoanalyze is None
    report = queue.health()
    assert any("never analyzed" in warning for warning in report.warnings), report.warnings


def test_health_read_by_a_role_that_may_not_vacuum_does_not_say_the_leader_vacuums(
    queue: leaseq.Queue, connect: Connect, database_url: str
) -> None:
    """README, "Restricted roles": with autovacuum off, a maintenance leader of a role
    that does not own the job table "leaves the table be". The README's worker role
    also runs the dashboard and the one-shot commands; read by that role, health()
    said "the maintenance leader vacuums the job table itself" (leader_vacuums, the
    warning, the CLI and the dashboard alike) while nothing vacuumed it."""
    with connect(autocommit=True) as conn:
        conn.execute(f'ALTER TABLE "{queue.schema}".job SET (autovacuum_enabled = false)')
    assert queue.health().leader_vacuums  # the owner's leader does vacuum it
    with (
        restricted_roles(database_url, queue.schema) as roles,
        leaseq.Queue(roles.worker, schema=queue.schema) as worker_role,
    ):
        report = worker_role.health()
        printed = CliRunner().invoke(
            cli, ["health", "--database-url", roles.worker, "--schema", queue.schema]
        )
    assert printed.exit_code == 0, printed.output
    assert "the maintenance leader vacuums the job table itself" not in printed.output
    assert "vacuumed by autovacuum" not in printed.output
    assert not report.leader_vacuums
    told = [w for w in report.warnings if "autovacuum is off" in w]
    assert len(told) == 1, report.warnings
    assert "vacuums the job table itself" not in told[0]
    assert "owner" in told[0]


# -- leaseq explain ---------------------------------------------------------------------


@pytest.mark.parametrize("setup", ["max_running", "groups"])
def test_explain_of_a_queue_claimed_through_claim_limited_says_its_plan_is_not_shown(
    queue: leaseq.Queue, setup: str
) -> None:
    """README: `leaseq explain` "prints the plan the server picks now for that
    queue's claim". A queue with limits or grouped jobs is claimed by
    claim_limited() (claim.sql): the plain branches the plan shows never run for it,
    and the function's own queries are not in EXPLAIN's output. explain still said
    "reads the ready index", no warning: a verdict about a plan that does not run."""
    if setup == "max_running":
        queue.configure_queue("emails", max_running=2)
        queue.enqueue_many("emails", [{"n": n} for n in range(20)])
    else:
        queue.enqueue_many("emails", [{"n": n} for n in range(20)], group="tenant-1")
    plan = queue.explain_claim("emails")
    assert any("claim_limited" in w for w in plan.warnings), plan.warnings
    printed = CliRunner().invoke(
        cli,
        ["explain", "--queue", "emails", "--database-url", queue.dsn, "--schema", queue.schema],
    )
    assert printed.exit_code == 0, printed.output
    assert "claim of queue 'emails': reads the ready index" not in printed.output
    assert "claim_limited" in printed.output
    queue.enqueue("plain", {})  # a queue without either: as before
    plain = queue.explain_claim("plain")
    assert plain.reads_ready_index
    assert plain.warnings == ()
