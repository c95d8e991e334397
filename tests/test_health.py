"""Table health, what holds back cleanup, the leader's vacuum, and the claim's live plan.

Each check states what an operator must be told: a long transaction elsewhere in
the database is named as the reason dead rows stay; autovacuum being off is said
and then covered by the maintenance leader; a claim plan that stops reading the
ready index is flagged.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable

import psycopg
import pytest
from click.testing import CliRunner

import leaseq
from leaseq._cli import cli
from leaseq.testing import aset_clock_offset

from .clients import Client
from .roles import restricted_roles

Connect = Callable[..., psycopg.Connection[tuple[object, ...]]]


def _churn(client: Client, queue_name: str, jobs: int, batch: int = 1000) -> None:
    """Enqueue, claim and complete ``jobs`` jobs: two dead row versions each."""
    for start in range(0, jobs, batch):
        client.enqueue_many(queue_name, [{"n": n} for n in range(start, start + batch)])
        while claims := client.claim(queue_name, limit=batch):
            client.complete_many(claims)


def _job_table(client: Client, **options: float) -> leaseq.TableHealth:
    table = client.health(**options).table("job")
    assert table is not None
    return table


def _until_dead_rows(client: Client, predicate: Callable[[int], bool], what: str) -> None:
    """The statistics the server keeps lag a moment behind the writes."""
    deadline = time.monotonic() + 30
    while not predicate(_job_table(client).dead_tuples):
        if time.monotonic() > deadline:
            pytest.fail(f"dead rows never {what}: {_job_table(client).dead_tuples}")
        time.sleep(0.2)


def _vacuum(connect: Connect, schema: str) -> None:
    with connect(autocommit=True) as conn:
        conn.execute(f'VACUUM "{schema}".job')


def test_health_describes_every_table_and_index_of_the_schema(client: Client) -> None:
    client.enqueue("reports", {"n": 1})
    report = client.health()
    names = {t.name for t in report.tables}
    assert {"job", "queue", "backlog", "key_repair"} <= names
    job = report.table("job")
    assert job is not None
    assert job.total_bytes >= job.table_bytes + job.index_bytes > 0
    assert {"job_ready_idx", "job_lease_idx", "job_pkey"} <= {
        i.name for i in report.indexes if i.table == "job"
    }
    assert all(i.bytes > 0 for i in report.indexes)


def test_an_unmigrated_schema_is_reported_not_raised(
    client_class: type[Client], database_url: str
) -> None:
    with client_class(database_url, schema="t_never_migrated_here") as fresh:
        report = fresh.health()
    assert report.tables == ()
    assert any("leaseq migrate" in w for w in report.warnings)


@pytest.mark.xdist_group("cleanup_horizon")  # it holds back VACUUM database-wide on purpose
def test_a_long_transaction_is_named_as_the_reason_dead_rows_stay(
    client: Client, connect: Connect, schema: str
) -> None:
    holder = connect(autocommit=True)
    holder_pid = holder.info.backend_pid
    holder.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
    holder.execute("SELECT 1")  # takes the snapshot; then idles in transaction
    _churn(client, "reports", 20_000)  # 20,000 claims and completions after it began
    _vacuum(connect, schema)  # cannot remove what the snapshot may still see
    _until_dead_rows(client, lambda dead: dead >= 20_000, "counted")

    report = client.health(long_transaction=0.5)
    holders = [h for h in report.holders if h.name.startswith(f"pid {holder_pid}")]
    assert holders
    assert holders[0].state == "idle in transaction"
    reasons = [w for w in report.warnings if f"pid {holder_pid}" in w]
    assert len(reasons) == 1, report.warnings
    assert "why the queue slows down" in reasons[0]
    assert f"pg_terminate_backend({holder_pid})" in reasons[0]
    assert "dead rows" in reasons[0]

    holder.execute("ROLLBACK")
    deadline = time.monotonic() + 30
    while _job_table(client).dead_tuples >= 1000:  # other tests' short transactions pass
        assert time.monotonic() < deadline, "the dead rows were never removed"
        _vacuum(connect, schema)
        time.sleep(0.2)
    after = client.health(long_transaction=0.5)
    assert not [w for w in after.warnings if f"pid {holder_pid}" in w]


def test_a_transaction_under_the_threshold_is_not_warned_about(
    client: Client, connect: Connect
) -> None:
    holder = connect(autocommit=True)
    holder.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
    holder.execute("SELECT 1")
    report = client.health(long_transaction=3600)
    assert any(h.name.startswith(f"pid {holder.info.backend_pid}") for h in report.holders)
    assert not [w for w in report.warnings if f"pid {holder.info.backend_pid}" in w]
    holder.execute("ROLLBACK")


@pytest.mark.xdist_group("cleanup_horizon")  # its vacuum must be able to remove dead rows
async def test_autovacuum_off_for_the_job_table_is_said_and_the_leader_vacuums_it(
    aqueue: leaseq.AsyncQueue, queue: leaseq.Queue, connect: Connect, schema: str
) -> None:
    with connect(autocommit=True) as conn:
        conn.execute(f'ALTER TABLE "{schema}".job SET (autovacuum_enabled = false)')
    report = queue.health()
    assert report.leader_vacuums
    assert any("autovacuum is off" in w for w in report.warnings)
    _churn(queue, "reports", 3000)
    _until_dead_rows(queue, lambda dead: dead > 3000, "counted")

    # The leader vacuums again on every pass while the dead rows are still due (a
    # transaction elsewhere may keep its first vacuum from removing them). Due, as
    # documented: past 1000 + 1% of the rows (a vacuum that could not remove a last
    # batch of 1000, held by another test process's snapshot, leaves it for the next
    # time the threshold is passed, as autovacuum would).
    def clean_enough(table: leaseq.TableHealth) -> bool:
        return table.dead_tuples <= 1000 + 0.01 * table.live_tuples

    maintenance = leaseq.Maintenance(aqueue, interval=0.1)
    task = asyncio.create_task(maintenance.run())
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        await asyncio.sleep(0.2)
        job = (await aqueue.health()).table("job")
        if maintenance.vacuums and job is not None and clean_enough(job):
            break
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)

    assert maintenance.vacuums >= 1
    job = _job_table(queue)
    assert job.last_vacuum is not None  # a manual vacuum: the leader's, not autovacuum's
    assert clean_enough(job)
    assert job.dead_tuples < 3000  # it did remove what it could


@pytest.mark.xdist_group("cleanup_horizon")  # its vacuum must be able to remove dead rows
async def test_a_vacuum_held_up_by_a_lock_never_stops_the_reaper(
    aqueue: leaseq.AsyncQueue, queue: leaseq.Queue, connect: Connect, schema: str
) -> None:
    """With autovacuum off the leader vacuums the job table on its own session,
    between reaping rounds. A VACUUM waits for the table's SHARE UPDATE EXCLUSIVE
    lock, which an operator's own VACUUM or CREATE INDEX CONCURRENTLY of the table
    holds for minutes or hours: the leader waited as long, and reaped nothing
    meanwhile. What must hold: exhausted jobs are failed while such a lock is held,
    and the leader vacuums once it is gone."""
    with connect(autocommit=True) as conn:
        conn.execute(f'ALTER TABLE "{schema}".job SET (autovacuum_enabled = false)')
    _churn(queue, "reports", 3000)
    _until_dead_rows(queue, lambda dead: dead > 3000, "counted")
    maintenance = leaseq.Maintenance(aqueue, interval=0.05, retention=False)
    task: asyncio.Task[None] | None = None
    with connect() as blocker, connect(autocommit=True) as watcher:
        try:
            blocker.execute(f'LOCK TABLE "{schema}".job IN SHARE UPDATE EXCLUSIVE MODE')
            task = asyncio.create_task(maintenance.run())
            deadline = time.monotonic() + 10
            waiting: list[object] = []
            while not waiting and time.monotonic() < deadline:  # the leader's VACUUM waits
                await asyncio.sleep(0.05)
                waiting = watcher.execute(
                    "SELECT 1 FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                    " AND query LIKE %s",
                    (f'VACUUM%"{schema}".job%',),
                ).fetchall()
            # Now a job's last attempt ends with its lease: the reaper's to fail.
            (job_id,) = await aqueue.enqueue_many("q", [{}], max_attempts=1)
            await aqueue.claim("q", lease=1)
            await aset_clock_offset(aqueue, 5)
            deadline = time.monotonic() + 10
            while maintenance.reaped < 1 and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            assert (await aqueue.get(job_id)).status is leaseq.JobStatus.FAILED, (
                "nothing reaped while the leader's vacuum waited for a lock"
            )
            blocker.rollback()
            deadline = time.monotonic() + 30
            while not maintenance.vacuums and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            assert maintenance.vacuums >= 1
        finally:
            blocker.rollback()
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)


async def test_a_leader_that_may_not_vacuum_the_table_says_so_once_and_counts_no_vacuum(
    queue: leaseq.Queue,
    connect: Connect,
    schema: str,
    database_url: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Only the table's owner may VACUUM or ANALYZE it. A leader of another role
    (the README's restricted worker role) had PostgreSQL skip its vacuum with a
    warning in the server's log at every pass, and logged "vacuumed" itself."""
    with connect(autocommit=True) as conn:
        conn.execute(f'ALTER TABLE "{schema}".job SET (autovacuum_enabled = false)')
    _churn(queue, "reports", 3000)
    _until_dead_rows(queue, lambda dead: dead > 3000, "counted")
    with restricted_roles(database_url, schema) as roles:
        async with leaseq.AsyncQueue(roles.worker, schema=schema) as worker_role:
            maintenance = leaseq.Maintenance(worker_role, interval=0.1)
            with caplog.at_level("INFO", logger="leaseq"):
                task = asyncio.create_task(maintenance.run())
                await asyncio.sleep(1.5)  # passes enough for a vacuum at each
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
    assert maintenance.vacuums == 0
    assert maintenance.analyzes == 0
    told = [r.getMessage() for r in caplog.records if "owner" in r.getMessage()]
    assert len(told) == 1, told
    assert f"{schema}.job" in told[0]
    assert "autovacuum is off" in told[0]
    assert not [r for r in caplog.records if r.getMessage().startswith("vacuumed")]
    assert _job_table(queue).dead_tuples > 3000  # nothing removed them, as said


async def test_with_autovacuum_off_the_leader_analyzes_a_backlog_being_built(
    aqueue: leaseq.AsyncQueue, queue: leaseq.Queue, connect: Connect, schema: str
) -> None:
    """Inserts leave no dead rows: nothing analyzed a backlog being built, so the
    planner and stats()' estimates knew nothing of it (one queue of two shown with
    tens of thousands of done jobs)."""
    with connect(autocommit=True) as conn:
        conn.execute(f'ALTER TABLE "{schema}".job SET (autovacuum_enabled = false)')
    for start in range(0, 6000, 2000):
        queue.enqueue_many("reports", [{"n": n} for n in range(start, start + 2000)])

    def analyzed() -> bool:
        with connect(autocommit=True) as conn:
            row = conn.execute(
                "SELECT count(*) FROM pg_stats WHERE schemaname = %s AND tablename = 'job'",
                (schema,),
            ).fetchone()
        return row is not None and int(str(row[0])) > 0

    assert not analyzed()
    maintenance = leaseq.Maintenance(aqueue, interval=0.1)
    task = asyncio.create_task(maintenance.run())
    deadline = time.monotonic() + 30
    while not maintenance.analyzes and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    await asyncio.sleep(0.5)  # more passes: analyzed once, not at every pass
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert maintenance.analyzes == 1
    assert maintenance.vacuums == 0  # no dead rows to speak of
    assert analyzed()


async def test_with_dead_rows_uncounted_the_leader_vacuums_on_a_timer(
    database_url: str, schema: str, queue: leaseq.Queue
) -> None:
    """``track_counts = off``: no dead row is counted (nor autovacuum run), so
    the leader cannot see when they pass the threshold. It vacuums at its first
    pass and then every VACUUM_UNCOUNTED_SECONDS, not at every pass. It used to
    wait for a count that never came."""
    _churn(queue, "reports", 200)
    blind = leaseq.AsyncQueue(
        database_url,
        schema=schema,
        connection_options={"autocommit": True, "options": "-c track_counts=off"},
    )
    async with blind:
        assert not (await blind.health()).server_autovacuum
        maintenance = leaseq.Maintenance(blind, interval=0.1)
        task = asyncio.create_task(maintenance.run())
        deadline = time.monotonic() + 30
        while not maintenance.vacuums and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        assert maintenance.vacuums == 1
        await asyncio.sleep(1.0)  # ten passes more: the timer, not every pass
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert maintenance.vacuums == 1
    assert leaseq._maintenance.VACUUM_UNCOUNTED_SECONDS >= 60


async def test_the_leader_leaves_vacuum_to_autovacuum_when_it_runs(
    aqueue: leaseq.AsyncQueue, queue: leaseq.Queue
) -> None:
    if not queue.health().server_autovacuum:
        pytest.skip("autovacuum is off for this server (the embedded one runs it)")
    assert not queue.health().leader_vacuums
    _churn(queue, "reports", 3000)
    maintenance = leaseq.Maintenance(aqueue, interval=0.1)
    task = asyncio.create_task(maintenance.run())
    await asyncio.sleep(1.0)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert maintenance.vacuums == 0


def test_the_claim_plan_reads_the_ready_index_over_a_large_table(
    queue: leaseq.Queue, connect: Connect, schema: str
) -> None:
    with connect(autocommit=True) as conn:  # 100,000 finished rows, fast
        conn.execute(
            f"""INSERT INTO "{schema}".job (queue, payload, payload_bytes, status,
                   available_at, max_attempts, attempts, finished_at)
                SELECT 'reports', '{{}}', 2, 'done', now(), 20, 1, now()
                FROM generate_series(1, 100000)"""
        )
    for start in range(1, 20_001, 5000):  # one key's backlog of 20,000
        queue.enqueue_many("reports", [{}] * 5000, key="k", seqs=range(start, start + 5000))
    queue.enqueue_many("reports", [{}] * 100)
    with connect(autocommit=True) as conn:
        conn.execute(f'ANALYZE "{schema}".job')
    plan = queue.explain_claim("reports")
    assert plan.reads_ready_index, plan.plan
    assert plan.warnings == ()
    assert queue.stats("reports")[0].counts[leaseq.JobStatus.RUNNING] == 0  # nothing claimed

    with connect(autocommit=True) as conn:  # now the plan cannot read it
        conn.execute(f'DROP INDEX "{schema}".job_ready_idx')
    plan = queue.explain_claim("reports")
    assert not plan.reads_ready_index
    assert len(plan.warnings) == 1
    assert "job_ready_idx" in plan.warnings[0]


def test_bad_input_to_health_and_explain_is_refused(client: Client) -> None:
    with pytest.raises(leaseq.InvalidArgument):
        client.health(long_transaction=-1)
    with pytest.raises(leaseq.InvalidArgument):
        client.explain_claim("no spaces allowed")


def test_cli_health_and_explain(queue: leaseq.Queue, database_url: str, schema: str) -> None:
    queue.enqueue("reports", {"n": 1})
    runner = CliRunner()
    options = ["--database-url", database_url, "--schema", schema]
    result = runner.invoke(cli, ["health", *options])
    assert result.exit_code == 0, result.output
    assert "job_ready_idx" in result.output
    assert "autovacuum:" in result.output
    result = runner.invoke(cli, ["health", "--json", *options])
    assert result.exit_code == 0, result.output
    document = json.loads(result.output)
    assert {"job", "queue"} <= {t["name"] for t in document["tables"]}
    result = runner.invoke(cli, ["explain", "--queue", "reports", *options])
    assert result.exit_code == 0, result.output
    assert "claim of queue 'reports': reads the ready index" in result.output
    result = runner.invoke(cli, ["explain", *options])
    assert result.exit_code == 0
    assert "'reports'" in result.output
