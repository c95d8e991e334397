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
