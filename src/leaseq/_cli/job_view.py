"""Looking at jobs, changing nothing: ``leaseq job ID`` (one job whole) and
``leaseq failed`` (the newest failed jobs), each as a table or ``--json``.

What they print of a job is what the dashboard's job page shows, through the same
parts: its timeline (``leaseq._timeline``) and its payload with the values of
secret fields hidden (``leaseq._secret_fields``). Text someone else wrote (an
error, a key, a payload) is redacted and, at the terminal, has its controls
written out (:func:`~.common.shown`); in JSON it is redacted only (JSON escapes
the rest itself). Times are ISO 8601 in UTC.
"""

from __future__ import annotations

import json
import re
from datetime import datetime
from typing import Any

import click
from rich import box
from rich.table import Table
from rich.text import Text

from leaseq import Job, JobStatus, Queue

from .._redact import redact
from .._secret_fields import SecretMask
from .._timeline import Event, blocked_by, timeline
from .common import cli, console, database_options, open_queue, printable, require_queue, shown
from .common import utc_time as utc


def job_id_argument(ctx: click.Context, param: click.Parameter, value: str) -> int:
    """A job id as the database holds one (a bigint, from 1): anything else is a
    usage error, before any connection. (A callback, as ``retention.duration``.)"""
    text = value.strip()
    if _DIGITS.fullmatch(text) and 0 < int(text) < 2**63:
        return int(text)
    raise click.BadParameter(f"{value!r} is not a job id (a positive integer)", ctx, param)


#: ASCII digits only: int() also reads "٣", "+3" and "1_000".
_DIGITS = re.compile(r"[0-9]{1,19}")


@cli.command("job")
@click.argument("job_id", callback=job_id_argument)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@database_options
def job_command(job_id: int, as_json: bool, database_url: str | None, schema: str) -> None:
    """Show one job whole: its state, attempts, lease, times, why it waits, its
    history and its payload (secret fields hidden)."""
    with open_queue(database_url, schema) as queue:
        job = queue.get(job_id)  # JobNotFound says if retention archived it
        waiting = _waiting(queue, job)
    if as_json:
        click.echo(json.dumps(_job_json(job, waiting), indent=2))
        return
    _print_job(job, waiting)


def _waiting(queue: Queue, job: Job) -> list[str]:
    """What holds a queued job back from a claim, as far as the job tells (none:
    it is claimable; a queue's running and rate limits are not looked at)."""
    if job.status is not JobStatus.QUEUED:
        return []
    reasons = []
    if job.blocked_by is not None:
        reasons.append(blocked_by(job.blocked_by))
    elif job.ahead:
        reasons.append(f"behind {job.ahead} earlier unfinished job(s) of its ordering key")
    if job.attempts >= job.max_attempts:
        reasons.append("no attempts left: the reaper fails it (`leaseq reap`)")
    settings = queue.queue_settings(job.queue)
    if settings is not None and settings.paused:
        reasons.append(f"its queue is paused (`leaseq queue configure {job.queue} --resume`)")
    return reasons


def _job_json(job: Job, waiting: list[str]) -> dict[str, Any]:
    running = job.status is JobStatus.RUNNING
    return {
        "job_id": job.job_id,
        "queue": job.queue,
        "status": job.status.value,
        "attempts": job.attempts,
        "max_attempts": job.max_attempts,
        "priority": job.priority,
        "key": job.key,
        "seq": job.seq,
        "group": job.group,
        "unique_key": job.unique_key,
        "idempotency_key": job.idempotency_key,
        "timeout": job.timeout,
        "created_at": utc(job.created_at),
        "available_at": utc(job.available_at),
        "claimed_at": utc(job.claimed_at),
        "finished_at": utc(job.finished_at),
        "lease_version": job.lease_version,
        # A lease matters while the job runs: a finished job's last one is history.
        "lease_until": utc(job.lease_until) if running else None,
        "lease_remaining": job.lease_remaining,
        "ahead": job.ahead,
        "blocked_by": job.blocked_by,
        "waiting": waiting,
        "last_error": _redacted(job.last_error),
        "timeline": [_event_json(event) for event in timeline(job)],
        "history": [_entry_json(entry) for entry in job.history],
        "payload_bytes": job.payload_bytes,
        "payload": SecretMask().mask(job.payload),
    }


def _event_json(event: Event) -> dict[str, Any]:
    return {
        "at": _utc_text(event.at),
        "kind": event.kind,
        "text": redact(event.text),
        "actor": _redacted(event.actor),
        "error": _redacted(event.error),
    }


def _entry_json(entry: dict[str, Any]) -> dict[str, Any]:
    """A history entry as stored, its times in UTC and its texts redacted."""
    return {
        name: _utc_text(value)
        if name in _ENTRY_TIMES
        else redact(value)
        if isinstance(value, str)
        else value
        for name, value in entry.items()
    }


#: The fields of a history entry that hold a time.
_ENTRY_TIMES = frozenset({"at", "claimed_at", "renewed_at"})


def _utc_text(value: Any, timespec: str = "auto") -> Any:
    """A time of a history entry (jsonb holds it as text) in UTC; else as it is."""
    if isinstance(value, datetime):
        return utc(value, timespec)
    if isinstance(value, str):
        try:
            return utc(datetime.fromisoformat(value), timespec)
        except ValueError:
            return value
    return value


def _redacted(text: str | None) -> str | None:
    return None if text is None else redact(text)


def _print_job(job: Job, waiting: list[str]) -> None:
    running = job.status is JobStatus.RUNNING
    facts = Table.grid(padding=(0, 2))
    facts.add_column(style="bold", no_wrap=True)
    facts.add_column(overflow="fold")
    rows: list[tuple[str, str | Text]] = [
        ("status", job.status.value),
        ("attempts", f"{job.attempts} of {job.max_attempts}"),
        ("priority", str(job.priority)),
        ("ordering key", _ordering(job)),
        ("group", shown(job.group or "-")),
        ("unique key", shown(job.unique_key or "-")),
        ("idempotency key", shown(job.idempotency_key)),
        ("timeout", "-" if job.timeout is None else f"{job.timeout:g} s (its own)"),
        ("created", _when(job.created_at)),
        ("run at", _when(job.available_at)),
        ("claimed", _when(job.claimed_at)),
        ("finished", _when(job.finished_at)),
        ("lease version", str(job.lease_version)),
    ]
    if running:
        rows.append(("lease", _lease(job)))
    for reason in waiting:
        rows.append(("waiting", shown(reason)))
    for name, value in rows:
        facts.add_row(name, value)
    console.print(Text(f"job {job.job_id} in {printable(job.queue)}", style="bold"))
    console.print(facts)
    if job.last_error:
        console.print(Text("\nlast error", style="bold"))
        console.print(shown(job.last_error))
    history = Table("at", "event", "by", title="history", box=box.SIMPLE_HEAD, title_justify="left")
    history.add_column("error", overflow="fold")
    for event in timeline(job):
        at = _utc_text(event.at, "seconds")
        history.add_row(
            shown(str(at)) if at else "",
            shown(event.text),
            shown(event.actor or ""),
            shown(event.error or ""),
        )
    console.print(history)
    console.print(Text(f"payload ({job.payload_bytes} bytes; secret fields hidden)", style="bold"))
    # Masked first (its strings redacted too), then made printable whole: a
    # redaction run over the JSON text would take its quotes with a secret.
    console.print(Text(printable(SecretMask().pretty(job.payload))))


def _ordering(job: Job) -> Text:
    if job.key is None:
        return Text("-")
    text = f"{job.key} (seq {job.seq})"
    if job.ahead is not None:
        text += f", {job.ahead} unfinished ahead of it"
    return shown(text)


def _lease(job: Job) -> str:
    left = job.lease_remaining
    state = "" if left is None else f", {left:.1f} s left" if left >= 0 else ", expired"
    return f"until {_when(job.lease_until)}{state}"


def _when(moment: datetime | None) -> str:
    return utc(moment, "seconds") or "-"


@cli.command()
@click.option("--queue", "queue_name", default=None)
@click.option("--limit", default=50, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@database_options
def failed(
    queue_name: str | None, limit: int, as_json: bool, database_url: str | None, schema: str
) -> None:
    """List failed jobs with their last error and attempts."""
    with open_queue(database_url, schema) as queue:
        require_queue(queue, queue_name)
        jobs = queue.list_jobs(JobStatus.FAILED, queue=queue_name, limit=limit)
        total, estimated = len(jobs), False
        if len(jobs) == limit:  # maybe cut short: 50 rows read as "50 jobs failed"
            stats = queue.stats(queue_name)
            total = sum(s.counts[JobStatus.FAILED] for s in stats)
            estimated = any(JobStatus.FAILED in s.estimated for s in stats)
    # Cut: more failed than listed, or an estimate that cannot tell.
    cut = len(jobs) == limit and (total > limit or estimated)
    if as_json:
        listed = {
            "jobs": [_failed_json(job) for job in jobs],
            "limit": limit,
            "cut": cut,
            # Failed jobs in all (of --queue), when cut: an estimate on a large table.
            "total": max(total, len(jobs)),
            "total_estimated": estimated,
        }
        click.echo(json.dumps(listed, indent=2))
        return
    about = "~" if estimated else ""
    caption = f"the {limit} newest of {about}{total} failed jobs (--limit N for more)"
    _print_failed(jobs, caption if cut else None)


def _failed_json(job: Job) -> dict[str, Any]:
    return {
        "job_id": job.job_id,
        "queue": job.queue,
        "attempts": job.attempts,
        "max_attempts": job.max_attempts,
        "finished_at": utc(job.finished_at),
        "last_error": _redacted(job.last_error),
    }


def _print_failed(jobs: list[Job], caption: str | None) -> None:
    table = Table(
        "job",
        "queue",
        "attempts",
        "finished",
        title="failed jobs",
        caption=caption,
        box=box.SIMPLE_HEAD,
    )
    table.add_column("last error", overflow="fold")
    for job in jobs:
        table.add_row(
            str(job.job_id),
            job.queue,
            f"{job.attempts}/{job.max_attempts}",
            _when(job.finished_at),
            shown(job.last_error or ""),
        )
    console.print(table)
