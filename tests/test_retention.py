"""Retention: per-queue settings per finished state, applied in bounded batches by
the maintenance leader and by ``prune``; the archive; never a queued or running job,
never a failed job that holds its ordering key under ``block``; admission counters
untouched; and 50,000 finished jobs pruned while a claim loop drains new work."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import psycopg
import pytest
from click.testing import CliRunner, Result

import leaseq
from leaseq import InvalidArgument, JobNotFound, JobStatus, RetentionMode
from leaseq._cli import cli

from .clients import Client
from .conftest import AsyncClock, Clock

DAY = 86400.0
DONE, CANCELLED, FAILED = JobStatus.DONE, JobStatus.CANCELLED, JobStatus.FAILED


def finish(client: Client, queue: str, status: JobStatus, count: int = 1, **kw: Any) -> list[int]:
    """``count`` jobs of ``queue`` brought to ``status`` the way users do it."""
    ids = client.enqueue_many(queue, [{"n": n} for n in range(count)], **kw)
    if status is CANCELLED:
        for job_id in ids:
            assert client.cancel(job_id)
        return ids
    claims = client.claim(queue, limit=count)
    assert sorted(c.job_id for c in claims) == sorted(ids)
    if status is DONE:
        client.complete_many(claims)
    else:
        client.fail_many(claims, ["broken"] * count)
    return ids


def exists(client: Client, job_id: int) -> bool:
    try:
        client.get(job_id)
    except JobNotFound:
        return False
    return True


def rows(client: Client, sql: str, params: Any = None) -> list[Any]:
    with client.connection() as conn:
        return list(conn.execute(sql.replace("{schema}", f'"{client.schema}"'), params).fetchall())


def test_defaults_are_in_the_settings(client: Client) -> None:
    client.enqueue("reports", {})
    settings = client.queue_settings("reports")
    assert settings is not None
    assert (settings.retain_done, settings.retain_cancelled, settings.retain_failed) == (
        DAY,
        7 * DAY,
        30 * DAY,
    )
    assert settings.retention_mode is RetentionMode.DELETE
    assert settings.retain_archived == 90 * DAY
    changed = client.configure_queue(
        "reports", retain_done=60, retain_failed=None, retention_mode="archive"
    )
    assert (changed.retain_done, changed.retain_cancelled, changed.retain_failed) == (
        60,
        7 * DAY,
        None,
    )
    assert changed.retention_mode is RetentionMode.ARCHIVE
    assert client.queue_settings("reports") == changed


def test_each_state_is_kept_for_its_own_retention(client: Client, clock: Clock) -> None:
    client.configure_queue("q", retain_done=60, retain_cancelled=120, retain_failed=180)
    done = finish(client, "q", DONE, 2)
    cancelled = finish(client, "q", CANCELLED, 2)
    failed = finish(client, "q", FAILED, 2)
    assert len(client.prune()) == 0  # nothing is old enough yet
    clock.advance(90)
    result = client.prune()
    assert (result.deleted, result.archived, result.expired) == ({("q", DONE): 2}, {}, {})
    assert not any(exists(client, j) for j in done)
    assert all(exists(client, j) for j in cancelled + failed)
    clock.advance(60)
    assert client.prune().deleted == {("q", CANCELLED): 2}
    assert all(exists(client, j) for j in failed)
    clock.advance(60)
    assert client.prune().deleted == {("q", FAILED): 2}
    assert not any(exists(client, j) for j in failed)


def test_none_keeps_forever_unless_an_operator_says_older_than(
    client: Client, clock: Clock
) -> None:
    client.configure_queue("q", retain_done=None, retain_cancelled=None, retain_failed=None)
    ids = finish(client, "q", DONE) + finish(client, "q", CANCELLED) + finish(client, "q", FAILED)
    clock.advance(50 * 365 * DAY)
    assert len(client.prune()) == 0
    assert all(exists(client, j) for j in ids)
    # An explicit age replaces the queues' retention (an operator's decision).
    result = client.prune(states=["done"], older_than=DAY)
    assert result.deleted == {("q", DONE): 1}
    assert [exists(client, j) for j in ids] == [False, True, True]


def test_queued_and_running_jobs_are_never_pruned_even_when_old(
    client: Client, clock: Clock
) -> None:
    client.configure_queue("q", retain_done=0, retain_cancelled=0, retain_failed=0)
    queued = client.enqueue("q", {"state": "queued"}, delay=3600)
    running = client.enqueue("q", {"state": "running"})
    (claim,) = client.claim("q", lease=60)
    assert claim.job_id == running
    # A replayed job was failed (it has a finished past) and is queued again.
    replayed = finish(client, "q", FAILED)[0]
    assert client.replay(replayed)
    clock.advance(365 * DAY)  # the lease expired long ago: still a running job
    result = client.prune(older_than=0)
    assert len(result) == 0
    statuses = {j: client.get(j).status for j in (queued, running, replayed)}
    assert statuses == {
        queued: JobStatus.QUEUED,
        running: JobStatus.RUNNING,
        replayed: JobStatus.QUEUED,
    }


def test_a_failed_job_holding_its_key_under_block_is_kept(client: Client, clock: Clock) -> None:
    first, second = client.enqueue_many("q", [{"n": 1}, {"n": 2}], key="account-7", seqs=[1, 2])
    plain = client.enqueue("q", {"n": 0})
    claims = client.claim("q", limit=2)
    assert sorted(c.job_id for c in claims) == sorted([first, plain])
    client.fail_many(claims, ["broken", "broken"])
    clock.advance(31 * DAY)
    result = client.prune()
    assert result.deleted == {("q", FAILED): 1}  # the unordered one only
    assert not exists(client, plain)
    assert client.get(first).status is FAILED
    # The key is still held: its next job waits for an operator.
    assert client.claim("q") == []
    assert len(client.prune(older_than=0)) == 0  # not even by an explicit age
    # Under `continue` the failed job no longer holds anything: it may go.
    client.configure_queue("q", ordering_policy="continue")
    assert client.prune().deleted == {("q", FAILED): 1}
    assert not exists(client, first)
    (claim,) = client.claim("q")
    assert claim.job_id == second


def test_dry_run_counts_what_a_prune_removes_and_writes_nothing(
    client: Client, clock: Clock
) -> None:
    client.configure_queue("a", retain_done=60)
    client.configure_queue("b", retain_cancelled=60, retention_mode="archive")
    finish(client, "a", DONE, 3)
    finish(client, "a", FAILED, 2)
    finish(client, "b", CANCELLED, 4)
    clock.advance(120)
    before = rows(client, "SELECT job_id, xmin::text, xmax::text FROM {schema}.job ORDER BY 1")
    planned = client.prune(dry_run=True)
    assert planned.dry_run
    assert (planned.deleted, planned.archived) == ({("a", DONE): 3}, {("b", CANCELLED): 4})
    # No row deleted, locked (a lock sets xmax) or rewritten (xmin); nothing archived.
    after = rows(client, "SELECT job_id, xmin::text, xmax::text FROM {schema}.job ORDER BY 1")
    assert after == before
    assert rows(client, "SELECT count(*) FROM {schema}.job_archive") == [(0,)]
    done = client.prune()
    assert (done.deleted, done.archived, done.dry_run) == (planned.deleted, planned.archived, False)


@pytest.mark.parametrize("archived_older_than", [0, 30, None])
def test_a_dry_run_of_an_archive_says_what_the_run_archives_and_expires(
    client: Client, clock: Clock, archived_older_than: float | None
) -> None:
    """With no archive retention at all (0), what the run archives its archive batch
    expires too: the dry run counted none of those ("removed 10", then 20)."""
    client.configure_queue("q", retention_mode="archive", retain_done=60, retain_archived=3600)
    finish(client, "q", DONE, 3)
    clock.advance(120)
    client.prune()  # 3 in the archive
    finish(client, "q", DONE, 2)
    clock.advance(120)  # 2 more due; the archived 3 were archived 120 s ago
    planned = client.prune(dry_run=True, archived_older_than=archived_older_than)
    done = client.prune(archived_older_than=archived_older_than)
    assert (planned.deleted, planned.archived, planned.expired) == (
        done.deleted,
        done.archived,
        done.expired,
    )
    assert done.archived == {("q", DONE): 2}
    expected = {0: 5, 30: 3, None: 0}[archived_older_than]
    assert sum(done.expired.values()) == expected


def test_archive_mode_moves_rows_whole_and_the_archive_has_its_own_retention(
    client: Client, clock: Clock
) -> None:
    client.configure_queue("q", retention_mode="archive", retain_done=60, retain_archived=3600)
    ids = finish(client, "q", DONE, 3)
    jobs = {j: client.get(j) for j in ids}
    clock.advance(120)
    result = client.prune()
    assert (result.deleted, result.archived) == ({}, {("q", DONE): 3})
    assert not any(exists(client, j) for j in ids)
    archived = rows(
        client,
        "SELECT job_id, queue, payload, status, attempts, lease_version, created_at, finished_at,"
        " archived_at FROM {schema}.job_archive ORDER BY job_id",
    )
    assert [row[:8] for row in archived] == [
        (
            j.job_id,
            j.queue,
            j.payload,
            j.status.value,
            j.attempts,
            j.lease_version,
            j.created_at,
            j.finished_at,
        )
        for j in jobs.values()
    ]
    assert all(row[8] > row[7] for row in archived)  # archived after it finished
    clock.advance(1800)
    assert client.prune().expired == {}
    clock.advance(1900)
    assert client.prune().expired == {("q", DONE): 3}
    assert rows(client, "SELECT count(*) FROM {schema}.job_archive") == [(0,)]


def test_the_archive_has_every_column_of_the_job_table(client: Client) -> None:
    """A migration that adds a column to job must add it to job_archive and to
    sql/prune.sql's move, or archived jobs would lose it."""
    columns = (
        "SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute"
        " WHERE attrelid = %s::regclass AND attnum > 0 AND NOT attisdropped ORDER BY attnum"
    )
    job = rows(client, columns, (f'"{client.schema}".job',))
    archive = rows(client, columns, (f'"{client.schema}".job_archive',))
    assert sorted(archive) == sorted([*job, ("archived_at", "timestamp with time zone")])


def test_the_move_to_the_archive_keeps_every_column(client: Client, clock: Clock) -> None:
    """Each archived row is its job row, column for column (a column left out of
    sql/prune.sql's move would come out NULL or default)."""
    client.configure_queue("q", retention_mode="archive", retain_done=60)
    job_id = client.enqueue(
        "q",
        {"n": 1},
        key="k",
        seq=1,
        idempotency_key="i-1",
        timeout=5,
        unique_key="u-1",
        unique_for=3600,
        priority=3,
        group="tenant-1",
    )
    (claim,) = client.claim("q")
    client.complete(claim, result={"pages": 2})
    whole = "SELECT to_jsonb(j) - 'archived_at' FROM {schema}.%s AS j WHERE j.job_id = %%s"
    (before,) = rows(client, whole % "job", (job_id,))
    clock.advance(120)
    assert client.prune().archived == {("q", DONE): 1}
    assert rows(client, whole % "job_archive", (job_id,)) == [before]
    # Every column had a value to lose (but those a done job has none of).
    nothing = {"lease_until", "trace_context", "last_error"}
    assert {k for k, v in before[0].items() if v is None} <= nothing


def test_batches_are_bounded(client: Client, clock: Clock) -> None:
    client.configure_queue("q", retain_done=0)
    finish(client, "q", DONE, 25)
    clock.advance(1)
    first = client.prune(batch=10, max_batches=1)
    assert (first.deleted, first.more) == ({("q", DONE): 10}, True)
    rest = client.prune(batch=10, pause=0)
    assert (rest.deleted, rest.more) == ({("q", DONE): 15}, False)


def test_prune_keeps_the_admission_counters_exact(client: Client, clock: Clock) -> None:
    client.configure_queue("q", max_queued_jobs=1000, retain_done=0, retain_failed=0)
    finish(client, "q", DONE, 5)
    finish(client, "q", FAILED, 3)
    finish(client, "q", CANCELLED, 2)
    client.enqueue_many("q", [{"big": "x" * 100}] * 4)
    client.claim("q", limit=1)
    before = client.queue_settings("q")
    assert before is not None
    unfinished = rows(
        client,
        "SELECT count(*), coalesce(sum(payload_bytes), 0) FROM {schema}.job"
        " WHERE queue = 'q' AND status IN ('queued', 'running')",
    )
    assert [(before.backlog_jobs, before.backlog_bytes)] == unfinished
    clock.advance(8 * DAY)
    assert len(client.prune()) == 10
    after = client.queue_settings("q")
    assert after is not None
    assert (after.backlog_jobs, after.backlog_bytes) == (before.backlog_jobs, before.backlog_bytes)


@pytest.mark.parametrize(
    ("call", "arguments"),
    [
        ("configure_queue", {"retain_done": -1}),
        ("configure_queue", {"retain_failed": float("nan")}),
        ("configure_queue", {"retain_cancelled": "7d"}),
        ("configure_queue", {"retain_archived": -0.5}),
        ("configure_queue", {"retention_mode": "shred"}),
        ("prune", {"states": ["queued"]}),
        ("prune", {"states": ["running", "done"]}),
        ("prune", {"states": ["bogus"]}),
        ("prune", {"states": []}),
        ("prune", {"older_than": -5}),
        ("prune", {"archived_older_than": -5}),
        ("prune", {"batch": 0}),
        ("prune", {"batch": 10**6}),
        ("prune", {"pause": -1}),
        ("prune", {"max_batches": 0}),
        # Truthy or falsy values that are no bool: 0 pruned for real.
        ("prune", {"dry_run": 0}),
        ("prune", {"dry_run": "no"}),
        ("prune", {"dry_run": None}),
    ],
)
def test_bad_input_is_refused_and_writes_nothing(
    client: Client, clock: Clock, call: str, arguments: dict[str, Any]
) -> None:
    client.configure_queue("q", retain_done=0)
    (job_id,) = finish(client, "q", DONE)
    clock.advance(10)
    before = client.queue_settings("q")
    with pytest.raises(InvalidArgument):
        if call == "configure_queue":
            client.configure_queue("q", **arguments)
        else:
            client.prune(**arguments)
    assert client.queue_settings("q") == before
    assert exists(client, job_id)


def test_one_queue_and_chosen_states_only(client: Client, clock: Clock) -> None:
    for name in ("a", "b"):
        client.configure_queue(name, retain_done=0, retain_cancelled=0)
        finish(client, name, DONE)
        finish(client, name, CANCELLED)
    clock.advance(1)
    assert client.prune("a", states=["cancelled"]).deleted == {("a", CANCELLED): 1}
    assert client.prune(states=(s for s in [DONE])).deleted == {("a", DONE): 1, ("b", DONE): 1}
    assert client.prune("b", states="done").deleted == {}  # (a state alone is one state)
    assert client.prune().deleted == {("b", CANCELLED): 1}


@pytest.mark.parametrize(
    "option",
    [
        {"interval": 0},  # reaped in a busy loop
        {"interval": -1},
        {"interval": float("nan")},  # never ran again
        {"interval": float("inf")},
        {"interval": "5"},
        {"batch": 0},  # failed only at run()
        {"batch": 10_001},
        {"batch": 2.5},
        {"prune_pause": -1},
        {"prune_pause": float("nan")},
        {"prune_pause": "0.1"},
        {"retention": "no"},
        {"vacuum": None},
    ],
    ids=repr,
)
def test_bad_maintenance_options_are_refused_at_construction(option: dict[str, Any]) -> None:
    queue = leaseq.AsyncQueue("postgresql://nobody@127.0.0.1:1/none")
    (name,) = option
    with pytest.raises(InvalidArgument, match=name):
        leaseq.Maintenance(queue, **option)


def test_maintenance_wants_an_async_queue() -> None:
    """A sync Queue failed only at run(), on its first await."""
    with pytest.raises(InvalidArgument, match="AsyncQueue"):
        leaseq.Maintenance(leaseq.Queue("postgresql://nobody@127.0.0.1:1/none"))  # type: ignore[arg-type]


async def test_the_maintenance_leader_applies_retention(
    aqueue: leaseq.AsyncQueue, aclock: AsyncClock
) -> None:
    await aqueue.configure_queue("q", retain_done=60, retention_mode="delete")
    await aqueue.configure_queue("archived", retain_cancelled=60, retention_mode="archive")
    (done,) = await aqueue.enqueue_many("q", [{}])
    await aqueue.complete_many(await aqueue.claim("q"))
    kept = await aqueue.enqueue("q", {}, delay=10 * DAY)
    cancelled = await aqueue.enqueue("archived", {})
    assert await aqueue.cancel(cancelled)
    await aclock.advance(120)
    maintenance = leaseq.Maintenance(aqueue, interval=0.05, batch=10, prune_pause=0)
    task = asyncio.create_task(maintenance.run())
    try:
        async with asyncio.timeout(30):
            while maintenance.pruned < 2:
                await asyncio.sleep(0.05)
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    for job_id in (done, cancelled):
        with pytest.raises(JobNotFound):
            await aqueue.get(job_id)
    assert (await aqueue.get(kept)).status is JobStatus.QUEUED
    async with aqueue.connection() as conn:
        cursor = await conn.execute(f'SELECT job_id FROM "{aqueue.schema}".job_archive')
        assert await cursor.fetchall() == [(cancelled,)]


BULK = 50_000


def _table_health(queue: leaseq.Queue) -> tuple[int, int, int, int]:
    """(dead tuples, live tuples, deletes so far, total size in bytes) of the job table."""
    with queue.connection() as conn:
        ((dead, live, deleted, size),) = conn.execute(
            "SELECT n_dead_tup, n_live_tup, n_tup_del, pg_total_relation_size(relid)"
            " FROM pg_stat_user_tables WHERE schemaname = %s AND relname = 'job'",
            (queue.schema,),
        ).fetchall()
    return dead, live, deleted, size


def _health_after(queue: leaseq.Queue, deletes: int) -> tuple[int, int, int, int]:
    """The table's numbers once the backends that deleted have reported (each flushes
    its statistics within about a second of going idle)."""
    deadline = time.monotonic() + 15
    while True:
        health = _table_health(queue)
        if health[2] >= deletes or time.monotonic() > deadline:
            return health
        time.sleep(0.2)


def test_50k_finished_jobs_pruned_while_a_claim_loop_drains_new_work(
    queue: leaseq.Queue, database_url: str
) -> None:
    """Nothing queued or running is touched, every claim completes, the admission
    counters stay exact; the longest claim, the dead tuples and the table size are
    measured and printed (timings are not asserted: bench/ is for that)."""
    queue.configure_queue("old", retain_done=DAY, max_queued_jobs=10**6)
    queue.configure_queue("work", max_queued_jobs=10**6)
    with queue.connection() as conn:
        conn.execute(
            f'INSERT INTO "{queue.schema}".job (queue, payload, payload_bytes, status,'
            " available_at, max_attempts, attempts, lease_version, created_at, claimed_at,"
            " finished_at, counted)"
            " SELECT 'old', jsonb_build_object('n', n), 10, 'done', now() - interval '3 days',"
            " 20, 1, 1, now() - interval '3 days', now() - interval '3 days',"
            " now() - interval '2 days' - n * interval '1 millisecond', true"
            " FROM generate_series(1, %s) AS n",
            (BULK,),
        )
        conn.execute(f'ANALYZE "{queue.schema}".job')
    # Unfinished jobs of the pruned queue: waiting (delayed) and running (a long lease).
    waiting = queue.enqueue_many("old", [{"waiting": n} for n in range(50)], delay=DAY)
    queue.enqueue_many("old", [{"running": n} for n in range(50)])
    running = {c.job_id: c for c in queue.claim("old", limit=50, lease=3600)}
    backlog = queue.queue_settings("old"), queue.queue_settings("work")

    stop = threading.Event()
    produced: list[int] = []
    completed: list[int] = []
    claim_seconds: list[float] = []
    errors: list[BaseException] = []

    # The drains stop once the producer's last batch is in: after `stop` alone, a
    # batch still being enqueued could commit after their last empty claims.
    produced_all = threading.Event()

    def produce(worker: leaseq.Queue) -> None:
        try:
            while not stop.is_set():
                produced.extend(worker.enqueue_many("work", [{"new": n} for n in range(20)]))
                time.sleep(0.005)
        finally:
            produced_all.set()

    def drain(worker: leaseq.Queue) -> None:
        idle_after_stop = 0
        while idle_after_stop < 3:
            started = time.perf_counter()
            claims = worker.claim("work", limit=10)
            claim_seconds.append(time.perf_counter() - started)
            if claims:
                accepted = worker.complete_many(claims)
                completed.extend(c.job_id for c, ok in accepted if ok)
            elif produced_all.is_set():
                idle_after_stop += 1
            else:
                time.sleep(0.002)

    lock_waits: list[tuple[str, str]] = []

    def watch(worker: leaseq.Queue) -> None:
        """Samples the server's sessions for statements on this schema waiting for a
        lock (a claim held up by the pruner would show here)."""
        with worker.connection() as conn:
            while not stop.is_set():
                lock_waits.extend(
                    conn.execute(
                        "SELECT wait_event, left(query, 200) FROM pg_stat_activity"
                        " WHERE wait_event_type = 'Lock' AND query LIKE %s",
                        (f'%"{queue.schema}"%',),
                    ).fetchall()
                )
                time.sleep(0.005)

    def guarded(target: Any, worker: leaseq.Queue) -> None:
        try:
            target(worker)
        except BaseException as exc:  # reported by the test, not lost in a thread
            errors.append(exc)

    before = _table_health(queue)
    with leaseq.Queue(database_url, schema=queue.schema) as worker:
        threads = [
            threading.Thread(target=guarded, args=(produce, worker)),
            *(threading.Thread(target=guarded, args=(drain, worker)) for _ in range(2)),
            threading.Thread(target=guarded, args=(watch, worker)),
        ]
        for thread in threads:
            thread.start()
        time.sleep(0.3)  # the claim loop is running before the prune starts
        claims_before_prune = len(claim_seconds)
        started = time.perf_counter()
        result = queue.prune(batch=1000, pause=0.05)
        prune_seconds = time.perf_counter() - started
        claims_during_prune = claim_seconds[claims_before_prune:]
        stop.set()
        for thread in threads:
            thread.join(60)
    assert not errors, errors
    after = _health_after(queue, before[2] + BULK)

    assert result.deleted == {("old", DONE): BULK}
    assert (result.archived, result.expired) == ({}, {})
    # Every claim completed; every job produced during the prune was claimed and done.
    assert claims_during_prune
    assert sorted(completed) == sorted(produced)
    # No claim or completion was seen waiting for a lock. (Producers may wait for
    # each other: a commit that sent NOTIFY holds the server's one notification
    # lock. Nothing of the pruner's shows there either: it never waits.)
    worker_statements = (
        queue._store.claim("work", limit=10).statements[0].sql[:60],
        queue._store.complete([]).statements[0].sql[:60],
        queue._store.prune().statements[0].sql[:60],
    )
    # A relation extension lock ("extend") is not the pruner's: every writer that
    # needs a new page takes it (here the producers' inserts and the claims'
    # new row versions, on a loaded machine); the pruner only deletes.
    held_up = [
        (event, q)
        for event, q in lock_waits
        if q.startswith(worker_statements) and event != "extend"
    ]
    assert held_up == []
    # No queued or running job was touched.
    assert [queue.get(j).status for j in waiting] == [JobStatus.QUEUED] * len(waiting)
    for job_id, claim in running.items():
        job = queue.get(job_id)
        assert (job.status, job.lease_version) == (JobStatus.RUNNING, claim.lease_version)
    # The admission counters are what they were: finished rows are not counted.
    assert (queue.queue_settings("old"), queue.queue_settings("work")) == backlog
    with queue.connection() as conn:
        ((left,),) = conn.execute(
            f"SELECT count(*) FROM \"{queue.schema}\".job WHERE queue = 'old' AND status = 'done'"
        ).fetchall()
    assert left == 0

    with queue.connection() as conn:
        conn.execute(f'VACUUM "{queue.schema}".job')
    vacuumed = _table_health(queue)
    print(
        f"\npruned {BULK} done jobs in {prune_seconds:.2f}s (batches of 1000, 0.05s apart) "
        f"while {len(claims_during_prune)} claims ran: longest claim "
        f"{max(claims_during_prune) * 1000:.1f} ms, median "
        f"{sorted(claims_during_prune)[len(claims_during_prune) // 2] * 1000:.1f} ms "
        f"(before the prune: longest {max(claim_seconds[:claims_before_prune]) * 1000:.1f} ms"
        f" of {claims_before_prune}); "
        f"{len(completed)} new jobs done; lock waits seen: {len(held_up)} of claims, "
        f"completions or the pruner, {len(lock_waits)} in all\n"
        f"job table: dead tuples {before[0]} -> {after[0]} (after VACUUM {vacuumed[0]}), "
        f"size {before[3] / 2**20:.1f} MiB -> "
        f"{after[3] / 2**20:.1f} MiB (after VACUUM {vacuumed[3] / 2**20:.1f} MiB)"
    )


# -- the command line ------------------------------------------------------------------


def _invoke(database_url: str, schema: str, *arguments: str) -> Result:
    return CliRunner().invoke(cli, [*arguments, "--database-url", database_url, "--schema", schema])


def test_cli_queue_configure_reads_and_prints_durations(
    queue: leaseq.Queue, database_url: str
) -> None:
    result = _invoke(
        database_url,
        queue.schema,
        *("queue", "configure", "reports", "--retain-done", "90s", "--retain-cancelled", "2h"),
        *("--retain-failed", "never", "--retention-mode", "archive", "--retain-archived", "30d"),
    )
    assert result.exit_code == 0, result.output
    assert (
        "retain_done=90s retain_cancelled=2h retain_failed=never retention_mode=archive "
        "retain_archived=30d" in result.output
    )
    settings = queue.queue_settings("reports")
    assert settings is not None
    assert (settings.retain_done, settings.retain_cancelled, settings.retain_failed) == (
        90,
        7200,
        None,
    )
    assert (settings.retention_mode, settings.retain_archived) == (RetentionMode.ARCHIVE, 30 * DAY)
    result = _invoke(
        database_url,
        queue.schema,
        "queue",
        "configure",
        "reports",
        "--retain-failed",
        "forever",
        "--retain-done",
        "1d",
    )
    assert "retain_done=1d" in result.output
    assert "retain_failed=never" in result.output
    before = queue.queue_settings("reports")
    for bad in ("-5s", "3 fortnights", "soon"):
        refused = _invoke(
            database_url, queue.schema, "queue", "configure", "reports", "--retain-done", bad
        )
        assert refused.exit_code == 2, refused.output
        assert "not a duration" in refused.output
    assert queue.queue_settings("reports") == before


def test_cli_prune_prints_what_it_removed_per_queue_and_state(
    queue: leaseq.Queue, database_url: str, clock: Clock
) -> None:
    queue.configure_queue("a", retain_done=60)
    queue.configure_queue("b", retention_mode="archive", retain_cancelled=60)
    finish(queue, "a", DONE, 3)
    finish(queue, "a", FAILED, 2)
    finish(queue, "b", CANCELLED, 4)
    clock.advance(120)
    dry = _invoke(database_url, queue.schema, "prune", "--dry-run")
    assert dry.exit_code == 0, dry.output
    assert "would remove 7 finished jobs (dry run: nothing written)" in dry.output
    assert len(queue.list_jobs("done", queue="a")) == 3
    only = _invoke(
        database_url,
        queue.schema,
        "prune",
        "--queue",
        "a",
        "--state",
        "failed",
        "--older-than",
        "1m",
    )
    assert only.exit_code == 0, only.output
    assert "removed 2 finished jobs" in only.output
    lines = [line.split() for line in only.output.splitlines()]
    assert ["a", "failed", "2", "0", "0"] in lines
    everything = _invoke(database_url, queue.schema, "prune", "--batch", "2", "--pause", "0")
    assert everything.exit_code == 0, everything.output
    assert "removed 7 finished jobs" in everything.output
    lines = [line.split() for line in everything.output.splitlines()]
    assert ["a", "done", "3", "0", "0"] in lines
    assert ["b", "cancelled", "0", "4", "0"] in lines
    assert "removed 0 finished jobs" in _invoke(database_url, queue.schema, "prune").output
    for bad in (("--state", "queued"), ("--older-than", "yesterday"), ("--batch", "0")):
        refused = _invoke(database_url, queue.schema, "prune", *bad)
        assert refused.exit_code != 0, refused.output


async def test_maintenance_keeps_reaping_on_a_schema_without_retention(
    aqueue: leaseq.AsyncQueue, aclock: AsyncClock
) -> None:
    """New code on a schema not yet migrated to 0003 (a rolling upgrade): retention
    waits for the migration, the reaper goes on."""
    (job_id,) = await aqueue.enqueue_many("q", [{}], max_attempts=1)
    await aqueue.claim("q", lease=1)
    await aclock.advance(5)  # the last attempt's lease expired: the reaper's job
    async with aqueue.connection() as conn:
        await conn.execute(f'ALTER TABLE "{aqueue.schema}".queue DROP COLUMN retain_done_seconds')
    maintenance = leaseq.Maintenance(aqueue, interval=0.05)
    task = asyncio.create_task(maintenance.run())
    try:
        async with asyncio.timeout(30):
            while maintenance.reaped < 1:
                await asyncio.sleep(0.05)
            await asyncio.sleep(0.3)  # more rounds: retention fails each time
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    assert (await aqueue.get(job_id)).status is JobStatus.FAILED
    with pytest.raises(leaseq.NotMigrated):
        await aqueue.prune()


@pytest.mark.xdist_group("cleanup_horizon")
async def test_a_prune_held_up_by_a_lock_never_stops_the_reaper(
    aqueue: leaseq.AsyncQueue, aclock: AsyncClock, database_url: str
) -> None:
    """An operator's lock on the archive (a CREATE INDEX for their own queries of it,
    a VACUUM FULL) held the leader's retention batch waiting for as long as it
    lasted, and the leader with it: no job was reaped meanwhile. What must hold:
    while retention cannot get its locks, exhausted jobs are still failed; once
    the lock is gone, retention is applied."""
    await aqueue.configure_queue("archived", retain_done=60, retention_mode="archive")
    (old,) = await aqueue.enqueue_many("archived", [{}])
    await aqueue.complete_many(await aqueue.claim("archived"))
    await aclock.advance(120)
    blocker = await psycopg.AsyncConnection.connect(database_url)
    maintenance = leaseq.Maintenance(aqueue, interval=0.05, prune_pause=0)
    task: asyncio.Task[None] | None = None
    try:
        await blocker.execute(f'LOCK TABLE "{aqueue.schema}".job_archive IN SHARE MODE')
        task = asyncio.create_task(maintenance.run())
        async with (
            asyncio.timeout(10),
            await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn,
        ):
            waiting: list[Any] = []
            while not waiting:  # the leader's retention waits for the archive's lock
                await asyncio.sleep(0.05)
                cursor = await conn.execute(
                    "SELECT 1 FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                    " AND query LIKE %s",
                    (f'%"{aqueue.schema}"%',),
                )
                waiting = await cursor.fetchall()
        # Now a job's last attempt ends with its lease: the reaper's to fail.
        (job_id,) = await aqueue.enqueue_many("q", [{}], max_attempts=1)
        await aqueue.claim("q", lease=1)
        await aclock.advance(5)
        try:
            async with asyncio.timeout(10):
                while maintenance.reaped < 1:
                    await asyncio.sleep(0.05)
        except TimeoutError:
            pass
        assert (await aqueue.get(job_id)).status is JobStatus.FAILED, (
            "nothing reaped while retention waited for a lock"
        )
        await blocker.rollback()
        async with asyncio.timeout(10):
            while maintenance.pruned < 1:
                await asyncio.sleep(0.05)
        with pytest.raises(JobNotFound):
            await aqueue.get(old)
    finally:
        await blocker.close()
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


def _plan(queue: leaseq.Queue, statement: Any) -> str:
    with queue.connection() as conn, conn.transaction(force_rollback=True):
        found = conn.execute("EXPLAIN (COSTS OFF) " + statement.sql, statement.params).fetchall()
    return "\n".join(row[0] for row in found)


def test_plans_a_batch_reads_the_finished_index_and_a_completion_never_does(
    queue: leaseq.Queue,
) -> None:
    """A prune batch reads the head of job_finished_idx (never the whole table), by
    primary key for the DELETE; and the new index gives the completion's resend check
    (`status = 'done'`) no bitmap scan over every done job (the trap a status-list
    predicate set: 9x slower completions)."""
    ids = queue.enqueue_many("work", [{}] * 3000)
    with queue.connection() as conn:
        conn.execute(f'ANALYZE "{queue.schema}".job')  # no finished job yet
    claims = queue.claim("work", limit=50)
    assert sorted(c.job_id for c in claims) == ids[:50]
    completion = _plan(queue, queue._store.complete(claims).statements[0])
    assert "job_finished_idx" not in completion

    queue.configure_queue("old")
    with queue.connection() as conn:
        conn.execute(
            f'INSERT INTO "{queue.schema}".job (queue, payload, payload_bytes, status,'
            " available_at, max_attempts, finished_at)"
            " SELECT 'old', '{}', 2, (ARRAY['done', 'failed', 'cancelled'])[1 + n % 3],"
            " now(), 20, now() - interval '60 days' FROM generate_series(1, 20000) AS n"
        )
        conn.execute(f'ANALYZE "{queue.schema}".job')
    batch = _plan(queue, queue._store.prune(limit=1000).statements[0])
    # (an ordered index scan of the head, or at this size a bitmap scan of the range)
    assert "Scan on job_finished_idx" in batch or "using job_finished_idx" in batch
    assert "Seq Scan on job" not in batch
    assert "Index Scan using job_pkey on job j_1" in batch  # the DELETE


def test_get_of_a_job_retention_moved_says_where_it_went(client: Client, clock: Clock) -> None:
    """``get(id)`` of a job retention archived said "no job N", as of an id never
    given: an operator looking a failed job up (the dashboard's job page, `leaseq
    job`) read a mistyped id, while the job sits in the archive. A job deleted by
    retention, or never enqueued, is named as either."""
    client.configure_queue("q", retention_mode="archive", retain_failed=60)
    (archived,) = finish(client, "q", FAILED)
    client.configure_queue("d", retain_done=60)
    (deleted,) = finish(client, "d", DONE)
    clock.advance(120)
    client.prune()
    with pytest.raises(JobNotFound, match=rf"no job {archived}\b.*failed.*archive") as found:
        client.get(archived)
    assert "retain_archived" in str(found.value), found.value
    for gone in (deleted, 424242):
        with pytest.raises(JobNotFound, match=rf"no job {gone}\b") as missing:
            client.get(gone)
        assert "archive" not in str(missing.value)
        assert "retention" in str(missing.value), missing.value
