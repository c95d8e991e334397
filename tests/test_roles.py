"""The README's "Restricted roles": a producer and a worker with only the grants
it documents do everything it says they do; a grant left out is a typed error
that writes nothing."""

from __future__ import annotations

import asyncio
import json
import time

import psycopg
import pytest
from click.testing import CliRunner
from psycopg.conninfo import conninfo_to_dict

import leaseq
from leaseq import JobStatus
from leaseq._cli import cli

from .roles import restricted_roles

pytestmark = pytest.mark.server_agnostic


def _job_rows(database_url: str, schema: str) -> int:
    with psycopg.connect(database_url) as conn:
        row = conn.execute(f'SELECT count(*) FROM "{schema}".job').fetchone()
    assert row is not None
    return int(row[0])


async def _run_until(worker: leaseq.Worker, done: asyncio.Event, seconds: float) -> None:
    running = asyncio.create_task(worker.run())
    try:
        await asyncio.wait_for(done.wait(), seconds)
    finally:
        worker.request_stop()
        await asyncio.wait_for(running, 30)


async def test_a_producer_with_the_documented_grants_enqueues_in_every_form(
    database_url: str, schema: str, queue: leaseq.Queue
) -> None:
    queue.configure_queue("bounded", max_queued_jobs=100, max_queued_bytes=10**6)
    with (
        restricted_roles(database_url, schema) as roles,
        leaseq.Queue(roles.producer, schema=schema) as producer,
    ):
        producer.enqueue("bounded", {"n": 0})  # a queue with admission limits
        producer.enqueue_many("bounded", [{"n": 0}, {"n": 0}], unique_keys=["a", "b"])
        for level in ("REPEATABLE READ", "SERIALIZABLE"):
            producer.enqueue("bounded", {"n": 0}, key=level, seq=1)  # the key's head
            with psycopg.connect(roles.producer) as own:
                own.execute(f"BEGIN ISOLATION LEVEL {level}")  # type: ignore[arg-type]
                producer.enqueue("bounded", {"n": 0}, key=level, seq=2, conn=own)
        plain = producer.enqueue("reports", {"n": 1})
        producer.enqueue("reports", {"n": 2}, delay=60)
        producer.enqueue("reports", {"n": 3}, key="customer-1", seq=2)
        producer.enqueue("reports", {"n": 4}, key="customer-1", seq=1)  # out of order
        first = producer.enqueue("reports", {"n": 5}, unique_key="daily")
        again = producer.enqueue("reports", {"n": 6}, unique_key="daily")
        producer.enqueue("reports", {"n": 7}, unique_key="weekly", unique_for=60)
        producer.enqueue("tenants", {"n": 8}, group="acme")
        producer.enqueue_many("reports", [{"n": 9}, {"n": 10}])
        producer.enqueue_many("reports", [{"n": 11}, {"n": 12}], key="c2", seqs=[1, 2])
        producer.enqueue_many("reports", [{"n": 13}, {"n": 14}], unique_keys=["a", "b"])
        producer.enqueue("a-queue-never-seen", {"n": 15})
        with psycopg.connect(roles.producer) as own:  # the caller's transaction
            producer.enqueue("reports", {"n": 16}, conn=own)
        job = producer.get(plain)
        with pytest.raises(leaseq.ResultNotReady):
            producer.result(plain)

        assert again == first
        assert again.existing
        assert job.status is JobStatus.QUEUED
        assert _job_rows(database_url, schema) == 22  # the unique one's twin wrote nothing

        # The worker role runs the job; the producer role waits for its result.
        app = leaseq.App(schema=schema)
        done = asyncio.Event()

        @app.task("reports")
        async def report(job: leaseq.JobContext) -> dict[str, int]:
            if job.job_id == plain:
                done.set()
            return {"pages": 3}

        worker = leaseq.Worker(app, dsn=roles.worker, concurrency=4, poll_interval=0.1)
        waiting = asyncio.create_task(
            asyncio.to_thread(producer.wait_result, plain, timeout=60, poll_interval=0.1)
        )
        await _run_until(worker, done, 60)
        assert await waiting == {"pages": 3}


async def test_a_worker_with_the_documented_grants_runs_maintains_and_operates(
    database_url: str, schema: str, queue: leaseq.Queue
) -> None:
    queue.configure_queue("work", max_running_per_group=1)
    plain = queue.enqueue_many("work", [{"kind": "ok"}] * 3)
    keyed = queue.enqueue_many("work", [{"kind": "ok"}] * 3, key="k", seqs=[1, 2, 3])
    flaky = queue.enqueue("work", {"kind": "flaky"}, max_attempts=2)
    broken = queue.enqueue("work", {"kind": "broken"}, max_attempts=1)
    grouped = queue.enqueue_many("work", [{"kind": "ok"}] * 2, group="acme")
    waiting = queue.enqueue("later", {}, delay=3600)
    finished = {*plain, *keyed, flaky, broken, *grouped}

    with restricted_roles(database_url, schema) as roles:
        app = leaseq.App(schema=schema)
        ended: set[int] = set()
        all_ended = asyncio.Event()
        order: list[int] = []

        @app.task("work", backoff=(0.05, 0.1))
        async def work(job: leaseq.JobContext) -> None:
            kind = job.payload["kind"]
            if job.key == "k":
                order.append(job.job_id)
            if kind == "broken" or (kind == "flaky" and job.attempts == 1):
                if kind == "broken":
                    ended.add(job.job_id)
                raise RuntimeError(f"{kind} on attempt {job.attempts}")
            ended.add(job.job_id)
            if ended >= finished:
                all_ended.set()

        worker = leaseq.Worker(
            app, dsn=roles.worker, concurrency=4, poll_interval=0.1, maintenance_interval=0.2
        )
        await _run_until(worker, all_ended, 60)
        assert order == list(keyed)

        # The operator's commands (the CLI and the dashboard use these) as the worker role.
        with leaseq.Queue(roles.worker, schema=schema) as operator:
            deadline = time.monotonic() + 30
            while operator.get(flaky).status is not JobStatus.DONE:
                assert time.monotonic() < deadline, operator.get(flaky)
                time.sleep(0.1)
            assert operator.get(broken).status is JobStatus.FAILED
            assert operator.replay(broken, actor="ops")
            assert operator.get(broken).status is JobStatus.QUEUED
            assert operator.cancel(waiting, actor="ops")
            operator.configure_queue("work", retain_done=0, actor="ops")
            pruned = operator.prune(states=["done"], older_than=0, pause=0)
            assert sum(pruned.deleted.values()) == 9  # 3 + 3 + flaky + 2 grouped
            assert [entry.actor for entry in operator.audit_log(limit=3)] == ["ops"] * 3
            assert {s.queue for s in operator.stats()} >= {"work", "later"}
            assert operator.find_jobs(status="cancelled").jobs[0].job_id == waiting
            assert operator.health().table("job") is not None


def test_a_grant_left_out_is_a_typed_error_that_writes_nothing(
    database_url: str, schema: str, queue: leaseq.Queue
) -> None:
    with (
        restricted_roles(database_url, schema, leave_out="key_hold") as roles,
        leaseq.Queue(roles.producer, schema=schema) as producer,
    ):
        producer.enqueue("reports", {})  # unkeyed jobs need no key_hold
        with pytest.raises(leaseq.DatabaseError) as refused:
            producer.enqueue("reports", {}, key="customer-1", seq=1)
    assert refused.value.sqlstate == "42501"
    assert "key_hold" in str(refused.value)
    assert _job_rows(database_url, schema) == 1


def test_a_role_blind_to_other_roles_transactions_is_told_and_sees_them_once_granted(
    database_url: str, schema: str, queue: leaseq.Queue
) -> None:
    """Another role's session idles in a transaction, holding back cleanup. The
    worker role with the documented grants cannot see it (PostgreSQL hides other
    roles' xmin): health says so instead of reporting nothing. Granted
    pg_read_all_stats, as the README says, it sees that session."""
    with (
        restricted_roles(database_url, schema) as roles,
        psycopg.connect(roles.producer) as other,
    ):
        pid = other.info.backend_pid
        other.execute("SELECT txid_current()")  # an open transaction with an xid
        with leaseq.Queue(roles.worker, schema=schema) as operator:
            blind = operator.health()
        assert not blind.sees_all_sessions
        assert [w for w in blind.warnings if "pg_read_all_stats" in w]
        with psycopg.connect(database_url, autocommit=True) as admin:
            worker_role = psycopg.conninfo.conninfo_to_dict(roles.worker)["user"]
            admin.execute(f"GRANT pg_read_all_stats TO {worker_role}")
        with psycopg.connect(database_url, autocommit=True) as admin:
            row = admin.execute(
                "SELECT age(backend_xid) FROM pg_stat_activity WHERE pid = %s", (pid,)
            ).fetchone()
        assert row is not None
        its_age = int(row[0])
        try:
            with leaseq.Queue(roles.worker, schema=schema) as operator:
                seeing = operator.health()
        finally:
            with psycopg.connect(database_url, autocommit=True) as admin:
                admin.execute(f"REVOKE pg_read_all_stats FROM {worker_role}")
        other.rollback()
    assert seeing.sees_all_sessions
    assert not [w for w in seeing.warnings if "pg_read_all_stats" in w]
    # Listed, unless the report's five oldest holders (other tests' sessions, in a
    # parallel run) are all older than it.
    listed = any(h.name.startswith(f"pid {pid}") for h in seeing.holders)
    five_older = len(seeing.holders) == 5 and all(h.xmin_age >= its_age for h in seeing.holders)
    assert listed or five_older, seeing.holders
    assert queue.health().sees_all_sessions  # the schema's owner (a superuser here)


def test_the_audit_log_records_the_role_that_wrote_each_action_whatever_actor_it_names(
    database_url: str, schema: str, queue: leaseq.Queue, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The actor is the caller's word (the CLI's comes from $USER): an operator
    could name anyone. The database role the server authenticated is recorded
    beside it, on every row, from the library and the CLI alike."""
    waiting = queue.enqueue_many("work", [{}, {}], delay=3600)
    with restricted_roles(database_url, schema) as roles:
        role = conninfo_to_dict(roles.worker)["user"]
        with leaseq.Queue(roles.worker, schema=schema) as operator:
            assert operator.cancel(waiting[0], actor="cli:root")
        monkeypatch.setenv("USER", "alice")
        monkeypatch.setenv("LOGNAME", "alice")
        cancelled = CliRunner().invoke(
            cli, ["cancel", str(waiting[1]), "--database-url", roles.worker, "--schema", schema]
        )
        assert cancelled.exit_code == 0, cancelled.output
        shown = CliRunner().invoke(
            cli, ["audit", "--json", "--database-url", database_url, "--schema", schema]
        )
    assert shown.exit_code == 0, shown.output
    assert [(e["actor"], e["db_role"]) for e in json.loads(shown.output)] == [
        ("cli:alice", role),
        ("cli:root", role),
    ]
    entries = queue.audit_log()
    assert [(e.actor, e.db_role) for e in entries] == [("cli:alice", role), ("cli:root", role)]
