"""A worker of a newer leaseq on a schema that misses its migrations (the code
deployed before `leaseq migrate` ran): it must not start work it cannot finish.
It claimed, and its first statement that needed the newer schema (a release,
the key holds of 0013) stopped it with the jobs it held left running until
their leases ran out. It now refuses to start, claims nothing, and says to
migrate; on an up-to-date schema, or one a newer leaseq migrated further, it
works."""

from __future__ import annotations

import asyncio

import psycopg
import pytest
from click.testing import CliRunner

import leaseq
from leaseq import JobStatus
from leaseq._cli import cli
from leaseq._statement import migration_files
from leaseq.testing import adrain

from .older_schemas import migrate_until


@pytest.fixture
def behind(database_url: str, schema: str) -> int:
    """The test's schema, one migration behind this code; yields its version."""
    last = migration_files()[-1][0] - 1
    migrate_until(database_url, schema, last)
    return last


def _app(schema: str, ran: list[int]) -> leaseq.App:
    app = leaseq.App(schema=schema)

    @app.task("work")
    async def work(job: leaseq.JobContext) -> None:
        ran.append(job.job_id)

    return app


@pytest.mark.parametrize("maintenance", [False, True])
async def test_a_worker_refuses_a_schema_behind_its_code_and_claims_nothing(
    database_url: str, schema: str, behind: int, maintenance: bool
) -> None:
    with psycopg.connect(database_url, autocommit=True) as conn:
        # A job the older leaseq enqueued (a plain row: this code's enqueue is not
        # what an older producer sends).
        conn.execute(
            f'INSERT INTO "{schema}".job (queue, payload, payload_bytes, available_at, '
            "max_attempts) VALUES ('work', '{}', 2, now(), 3)"
        )
    ran: list[int] = []
    worker = leaseq.Worker(
        _app(schema, ran), dsn=database_url, poll_interval=0.1, maintenance=maintenance
    )
    with pytest.raises(leaseq.NotMigrated) as refused:
        await asyncio.wait_for(worker.run(), 30)
    assert f"migration {behind}" in str(refused.value)
    assert "leaseq migrate" in str(refused.value)
    assert ran == []
    with psycopg.connect(database_url) as conn:
        rows = conn.execute(f'SELECT status, attempts FROM "{schema}".job').fetchall()
    assert rows == [("queued", 0)]  # not claimed, no attempt spent


async def test_once_migrated_the_same_worker_runs_the_job(
    database_url: str, schema: str, behind: int
) -> None:
    async with leaseq.AsyncQueue(database_url, schema=schema) as queue:
        await queue.migrate()
        job_id = await queue.enqueue("work", {})
        ran: list[int] = []
        await adrain(_app(schema, ran), dsn=database_url)
        assert ran == [job_id]
        assert (await queue.get(job_id)).status is JobStatus.DONE


async def test_a_schema_a_newer_leaseq_migrated_further_is_worked(
    database_url: str, schema: str
) -> None:
    """Migrate first, then deploy: during the rollout the older workers run on the
    newer schema. A migration this code does not know is no reason to stop."""
    async with leaseq.AsyncQueue(database_url, schema=schema) as queue:
        await queue.migrate()
        with psycopg.connect(database_url, autocommit=True) as conn:
            conn.execute(
                f'INSERT INTO "{schema}".migration (version, name) VALUES (9999, %s)',
                ("9999_from_the_future.sql",),
            )
        job_id = await queue.enqueue("work", {})
        ran: list[int] = []
        await adrain(_app(schema, ran), dsn=database_url)
        assert ran == [job_id]


async def test_maintenance_refuses_a_schema_behind_its_code(
    database_url: str, schema: str, behind: int
) -> None:
    """`leaseq maintenance` of a newer leaseq on a schema missing its migrations:
    its reaper's statements need them, and it ended at its first round with a
    database error about a missing column or function. It now says what to do,
    as a worker does, before it changes anything."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(
            f'INSERT INTO "{schema}".job (queue, payload, payload_bytes, available_at, '
            "max_attempts, attempts) VALUES ('work', '{}', 2, now(), 1, 1)"
        )  # exhausted: the reaper's to fail, once the schema is migrated
    async with leaseq.AsyncQueue(database_url, schema=schema) as queue:
        maintenance = leaseq.Maintenance(queue, interval=0.05)
        with pytest.raises(leaseq.NotMigrated) as refused:
            await asyncio.wait_for(maintenance.run(), 30)
        assert f"migration {behind}" in str(refused.value)
        assert "leaseq migrate" in str(refused.value)
        assert maintenance.reaped == 0
        await queue.migrate()
        maintenance = leaseq.Maintenance(queue, interval=0.05)
        running = asyncio.create_task(maintenance.run())
        try:
            async with asyncio.timeout(30):
                while maintenance.reaped < 1:
                    await asyncio.sleep(0.05)
        finally:
            running.cancel()
            with pytest.raises(asyncio.CancelledError):
                await running


def test_the_maintenance_command_says_to_migrate(
    database_url: str, schema: str, behind: int
) -> None:
    result = CliRunner().invoke(
        cli, ["maintenance", "--database-url", database_url, "--schema", schema]
    )
    assert result.exit_code != 0
    assert f"is at migration {behind}" in result.output
    assert "leaseq migrate" in result.output
    assert "Traceback" not in result.output


def test_health_says_a_schema_behind_its_code_must_be_migrated(
    database_url: str, schema: str, behind: int
) -> None:
    """Every worker of this code refuses the schema and `status` fails on it: a
    health check that reported it healthy (exit 0, no warning) would be a lie."""
    with leaseq.Queue(database_url, schema=schema, metrics=None) as queue:
        report = queue.health()
        assert any(
            f"is at migration {behind}" in w and "leaseq migrate" in w for w in report.warnings
        ), report.warnings
        assert report.table("job") is not None  # the rest of the report is still there
        options = ["--database-url", database_url, "--schema", schema]
        for extra in ([], ["--json"]):
            result = CliRunner().invoke(cli, ["health", *extra, *options])
            assert result.exit_code != 0, result.output
            assert "leaseq migrate" in result.output
            assert "Traceback" not in result.output
        queue.migrate()
        report = queue.health()
        assert not any("leaseq migrate" in w for w in report.warnings), report.warnings
        result = CliRunner().invoke(cli, ["health", *options])
        assert result.exit_code == 0, result.output
