"""A leaseq App for tests that run real worker processes (`leaseq worker`).

Every handler call is logged in ``attempt_log`` (autocommit, so crashes keep
it); the business effect goes to ``effect`` in the same transaction as the
completion. The schema comes from LEASEQ_SCHEMA.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time

import leaseq

SCHEMA = os.environ.get("LEASEQ_SCHEMA", "leaseq")
app = leaseq.App(schema=SCHEMA)

TABLES = (
    "CREATE TABLE IF NOT EXISTS {schema}.attempt_log"
    " (job_id bigint, attempt int, pid int, at timestamptz DEFAULT clock_timestamp())",
    "CREATE TABLE IF NOT EXISTS {schema}.effect (idempotency_key text, job_id bigint)",
)


@app.task("work")
def work(job: leaseq.JobContext) -> None:
    """payload: sleep (seconds, first attempt only unless 'always'), crash (kill -9 self),
    stubborn (sleep without looking at job.lost)."""
    with job.connection() as conn:
        conn.execute(
            f'INSERT INTO "{SCHEMA}".attempt_log (job_id, attempt, pid) VALUES (%s, %s, %s)',
            (job.job_id, job.attempts, os.getpid()),
        )
    payload = job.payload
    if payload.get("crash"):
        os.kill(os.getpid(), signal.SIGKILL)
    if payload.get("sleep") and payload.get("stubborn"):
        time.sleep(payload["sleep"])
    elif payload.get("sleep") and (job.attempts == 1 or payload.get("always")):
        deadline = time.monotonic() + payload["sleep"]
        while time.monotonic() < deadline and not job.lost.is_set():
            time.sleep(0.05)
        if job.lost.is_set():
            return
    with job.transaction() as conn:
        conn.execute(
            f'INSERT INTO "{SCHEMA}".effect (idempotency_key, job_id) VALUES (%s, %s)',
            (job.idempotency_key, job.job_id),
        )


@app.task("cpu", executor="process")
def cpu(job: leaseq.JobContext) -> int:
    """Runs in a child process of the worker: its effect and completion from there."""
    with job.transaction() as conn:
        conn.execute(
            f'INSERT INTO "{SCHEMA}".effect (idempotency_key, job_id) VALUES (%s, %s)',
            (job.idempotency_key, job.job_id),
        )
    return os.getpid()


# Periodic jobs, for tests/test_periodic_processes.py only: LEASEQ_TEST_SCHEDULES
# schedules ticking every second into "ticks", each tick's effect written with
# its completion.
for _n in range(int(os.environ.get("LEASEQ_TEST_SCHEDULES", "0"))):
    app.periodic(f"every-second-{_n}", queue="ticks", every=1, catch_up=60, payload={"n": _n})


@app.task("ticks")
def tick(job: leaseq.JobContext) -> None:
    with job.transaction() as conn:
        conn.execute(
            f'INSERT INTO "{SCHEMA}".effect (idempotency_key, job_id) VALUES (%s, %s)',
            (job.idempotency_key, job.job_id),
        )


# Limits, for tests/test_limits_processes.py: each handler call appends its
# start and its end (wall clock, taken in the handler itself) to a file of its
# process under LEASEQ_TEST_RUN_LOG, written at once, so a process killed -9
# keeps what it wrote.
RUN_LOG = os.environ.get("LEASEQ_TEST_RUN_LOG", "")


def _log_run(event: str, job_id: int) -> None:
    fd = os.open(f"{RUN_LOG}/{os.getpid()}.log", os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    try:
        os.write(fd, f"{event} {job_id} {time.time():.6f}\n".encode())
    finally:
        os.close(fd)


async def logged_run(job: leaseq.JobContext) -> None:
    """payload: sleep (seconds)."""
    _log_run("start", job.job_id)
    await asyncio.sleep(job.payload.get("sleep", 0))
    _log_run("end", job.job_id)


for _queue in ("limited", "rated", "fair"):
    app.task(_queue)(logged_run)


@app.task("deaf")
async def deaf(job: leaseq.JobContext) -> None:
    """An async handler that swallows every cancellation (some libraries' retry
    loops do) for payload['for'] seconds, then returns on its own."""
    deadline = time.monotonic() + job.payload["for"]
    while time.monotonic() < deadline:
        with contextlib.suppress(BaseException):  # deaf on purpose: the case under test
            await asyncio.sleep(0.2)


# Ordering keys, for tests/test_ordering_processes.py: each handler run is a row of
# "{schema}".key_run, its start committed before the work begins, its end written
# before the outcome is reported (with the completion, in its transaction), so the
# handlers' own record says which runs of a key overlapped. payload: sleep
# (seconds), crash (kill -9 of the worker on the first attempt), flaky (a
# transient error on the first attempt), fail_once (a permanent error unless a
# run of the job failed before: a replay then succeeds).
KEY_RUN_TABLES = (
    "CREATE TABLE IF NOT EXISTS {schema}.key_run (run_id bigserial PRIMARY KEY,"
    " job_id bigint, ordering_key text, attempt int, lease_version bigint, pid int,"
    " claimed_at timestamptz, started_at timestamptz, ended_at timestamptz, outcome text)",
    "CREATE TABLE IF NOT EXISTS {schema}.key_effect (job_id bigint)",
)


def _end_run(job: leaseq.JobContext, run_id: int, outcome: str) -> None:
    for _ in range(5):  # its connection may be terminated under it
        try:
            with job.connection() as conn:
                conn.execute(
                    f'UPDATE "{SCHEMA}".key_run SET ended_at = clock_timestamp(), outcome = %s'
                    " WHERE run_id = %s AND ended_at IS NULL",
                    (outcome, run_id),
                )
            return
        except Exception:  # any failure of a connection terminated under it
            time.sleep(0.05)


@app.task("keyed", backoff=(0.05, 0.2))
def keyed(job: leaseq.JobContext) -> None:
    with job.connection() as conn:
        row = conn.execute(
            f'INSERT INTO "{SCHEMA}".key_run (job_id, ordering_key, attempt, lease_version,'
            " pid, claimed_at, started_at) SELECT %s, %s, %s, %s, %s, (SELECT claimed_at FROM"
            f' "{SCHEMA}".job WHERE job_id = %s AND lease_version = %s), clock_timestamp()'
            " RETURNING run_id",
            (
                job.job_id,
                job.claim.key,
                job.attempts,
                job.lease_version,
                os.getpid(),
                job.job_id,
                job.lease_version,
            ),
        ).fetchone()
    assert row is not None
    run_id = int(row[0])
    try:
        _keyed_run(job, run_id)
    except BaseException:
        _end_run(job, run_id, "error")  # (nothing if the completion did commit)
        raise


def _keyed_run(job: leaseq.JobContext, run_id: int) -> None:
    payload = job.payload
    if payload.get("crash") and job.attempts == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    deadline = time.monotonic() + payload.get("sleep", 0)
    while time.monotonic() < deadline and not job.lost.is_set():
        time.sleep(0.01)
    if job.lost.is_set():
        _end_run(job, run_id, "lost")
        return
    if payload.get("flaky") and job.attempts == 1:
        _end_run(job, run_id, "retry")
        raise RuntimeError("flaky")
    if payload.get("fail_once"):
        with job.connection() as conn:
            failed = conn.execute(
                f'SELECT count(*) FROM "{SCHEMA}".key_run WHERE job_id = %s'
                " AND outcome = 'failed'",
                (job.job_id,),
            ).fetchone()
        if failed is not None and failed[0] == 0:
            _end_run(job, run_id, "failed")
            raise leaseq.PermanentError("fails once")
    with job.transaction() as conn:
        conn.execute(
            f'UPDATE "{SCHEMA}".key_run SET ended_at = clock_timestamp(), outcome = %s'
            " WHERE run_id = %s",
            ("done", run_id),
        )
        conn.execute(f'INSERT INTO "{SCHEMA}".key_effect (job_id) VALUES (%s)', (job.job_id,))
