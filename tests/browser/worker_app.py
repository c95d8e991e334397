"""The worker app the browser tests run in real `leaseq worker` processes.

``hold`` (sync) and ``hold_async`` run until their attempt is told to stop (a
cancel from the dashboard ends the claim: ``job.lost`` is set, an async handler
is cancelled), writing what they saw to ``marker``: started, stopped, and what
became of a completion tried anyway (``job.transaction()``, and the fenced
``Queue.complete`` with the old claim, with an effect in the same transaction).
Every handler call is in ``marker`` (autocommit), effects in ``effect``. The
schema comes from LEASEQ_SCHEMA.
"""

from __future__ import annotations

import asyncio
import os
import time

import leaseq

SCHEMA = os.environ.get("LEASEQ_SCHEMA", "leaseq")
app = leaseq.App(schema=SCHEMA)
#: How long a held handler waits for its stop signal before giving up.
HOLD_SECONDS = 60.0

TABLES = (
    'CREATE TABLE IF NOT EXISTS "{schema}".marker (job_id bigint, attempt int, pid int,'
    " what text, detail text, at timestamptz DEFAULT clock_timestamp())",
    'CREATE TABLE IF NOT EXISTS "{schema}".effect (job_id bigint, idempotency_key text)',
)
_MARK = (
    f'INSERT INTO "{SCHEMA}".marker (job_id, attempt, pid, what, detail)'
    " VALUES (%s, %s, %s, %s, %s)"
)
_EFFECT = f'INSERT INTO "{SCHEMA}".effect (job_id, idempotency_key) VALUES (%s, %s)'


def _mark(job: leaseq.JobContext, what: str, detail: str | None = None) -> None:
    with job.connection() as conn:
        conn.execute(_MARK, (job.job_id, job.attempts, os.getpid(), what, detail))


def _late_completion(job: leaseq.JobContext) -> None:
    """Try to complete anyway, both ways; record how each was refused."""
    try:
        with job.transaction() as conn:
            conn.execute(_EFFECT, (job.job_id, job.idempotency_key))
        _mark(job, "transaction", "completed")
    except leaseq.LeaseLost as exc:
        _mark(job, "transaction", f"refused: {type(exc).__name__}")
    # Past the handler's own check: the database's fence, with the effect in the
    # same transaction (it must roll back).
    with leaseq.Queue(schema=SCHEMA) as queue:
        try:
            with queue.connection() as conn, conn.transaction():
                conn.execute(_EFFECT, (job.job_id, job.idempotency_key))
                queue.complete(job.claim, conn=conn)
            _mark(job, "complete", "completed")
        except leaseq.LeaseLost as exc:
            _mark(job, "complete", f"refused: {type(exc).__name__}")


@app.task("hold", lease=3)
def hold(job: leaseq.JobContext) -> None:
    _mark(job, "started")
    deadline = time.monotonic() + HOLD_SECONDS
    while not job.lost.wait(0.05):
        if time.monotonic() > deadline:
            _mark(job, "gave up")
            return
    _mark(job, "stopped", job.lost_reason)
    _late_completion(job)


@app.task("hold_async", lease=3)
async def hold_async(job: leaseq.JobContext) -> None:
    await asyncio.to_thread(_mark, job, "started")
    try:
        await asyncio.sleep(HOLD_SECONDS)
    except asyncio.CancelledError:
        await asyncio.shield(asyncio.to_thread(_stopped_async, job))
        raise
    _mark(job, "gave up")


def _stopped_async(job: leaseq.JobContext) -> None:
    _mark(job, "stopped", "cancelled")
    _late_completion(job)


@app.task("fails", max_attempts=1)
def fails(job: leaseq.JobContext) -> None:
    """Fails for good: the Failed page's material."""
    _mark(job, "started")
    raise leaseq.PermanentError(job.payload.get("error", "template missing"))
