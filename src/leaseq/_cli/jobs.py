"""Commands on jobs and queues: enqueue, status, replay, cancel, reap, queue configure
(looking at jobs: ``job_view``)."""

from __future__ import annotations

import json
from typing import Any

import click
from rich import box
from rich.table import Table

from leaseq import (
    InvalidArgument,
    JobStatus,
    Queue,
)

from .._durations import exact_number
from .common import (
    actor,
    cli,
    console,
    database_options,
    open_queue,
    require_queue,
)
from .limits import NO_LIMIT, count_limit, format_limit, format_rate, rate_limit, running_limit
from .retention import NEVER, duration, format_duration


@cli.command()
@click.argument("queue_name", metavar="QUEUE")
@click.argument("payload", metavar="JSON")
@click.option("--delay", type=float, default=None, help="Seconds before it may run.")
@click.option("--key", default=None, help="Ordering key.")
@click.option("--seq", type=int, default=None, help="Sequence within the ordering key.")
@click.option("--priority", type=int, default=0, show_default=True, help="Higher runs first.")
@click.option("--max-attempts", type=int, default=None)
@click.option("--group", default=None, help="Its group (a tenant): per-group limits, turns.")
@database_options
def enqueue(
    queue_name: str, payload: str, database_url: str | None, schema: str, **options: Any
) -> None:
    """Enqueue one job whose payload is the JSON text given."""
    try:
        value = json.loads(payload)
    except (ValueError, RecursionError) as exc:  # ValueError: also an int past 4,300 digits
        raise InvalidArgument(f"payload is not valid JSON: {exc}") from None
    with open_queue(database_url, schema) as queue:
        job_id = queue.enqueue(queue_name, value, **options)
    click.echo(job_id)


@cli.command()
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option("--queue", "queue_name", default=None)
@database_options
def status(as_json: bool, queue_name: str | None, database_url: str | None, schema: str) -> None:
    """Per queue: jobs by state, queued bytes, oldest ready age, expired leases.

    Cheap on any table: finished counts of a large one are estimates (marked ~)."""
    with open_queue(database_url, schema) as queue:
        require_queue(queue, queue_name)
        stats = queue.stats(queue_name)
    if as_json:
        listed = [
            {
                "queue": s.queue,
                **{k.value: v for k, v in s.counts.items()},
                "queued_bytes": s.queued_bytes,
                "oldest_ready_age": s.oldest_ready_age,
                "expired_leases": s.expired_leases,
                "paused": s.paused,
                "estimated": sorted(state.value for state in s.estimated),
            }
            for s in stats
        ]
        click.echo(json.dumps(listed, indent=2))
        return
    rows = [
        [
            s.queue + (" (paused)" if s.paused else ""),
            *(("~" if k in s.estimated else "") + str(s.counts[k]) for k in JobStatus),
            str(s.queued_bytes),
            "-" if s.oldest_ready_age is None else f"{s.oldest_ready_age:.1f}s",
            str(s.expired_leases),
        ]
        for s in stats
    ]
    table = Table(title="leaseq status", box=box.SIMPLE_HEAD)
    # A long queue name folds onto more lines; a number is never cut short (rich
    # shrank the numbers to "12…" to keep a 128-character name on one line).
    table.add_column("queue", overflow="fold", min_width=min(QUEUE_COLUMN, _widest(rows, 0)))
    headings = (*(state.value for state in JobStatus), "bytes", "oldest", "expired")
    for column, heading in enumerate(headings, start=1):
        width = max(len(heading), _widest(rows, column))
        table.add_column(heading, justify="right", no_wrap=True, min_width=width)
    for row in rows:
        table.add_row(*row)
    if any(s.estimated for s in stats):
        table.caption = "~ estimate from the planner's statistics (a large table)"
    console.print(table)


#: How wide the status table's queue column is at least (a name up to this long
#: stays on one line when the numbers leave it room).
QUEUE_COLUMN = 24


def _widest(rows: list[list[str]], column: int) -> int:
    return max((len(row[column]) for row in rows), default=0)


@cli.command()
@click.argument("job_id", type=int, required=False)
@click.option("--queue", "queue_name", default=None)
@click.option("--all-failed", is_flag=True, help="Replay every failed job of --queue.")
@database_options
def replay(
    job_id: int | None,
    queue_name: str | None,
    all_failed: bool,
    database_url: str | None,
    schema: str,
) -> None:
    """Put a failed or cancelled job back in its queue (same id, fresh attempts)."""
    if (job_id is None) == (not all_failed):
        raise InvalidArgument("give a JOB_ID, or --queue Q --all-failed")
    if all_failed and queue_name is None:
        raise InvalidArgument("--all-failed needs --queue")
    if job_id is not None and queue_name is not None:
        # A job is replayed in its own queue: --queue would look like a check it is not.
        raise InvalidArgument("--queue goes with --all-failed: give a JOB_ID alone")
    with open_queue(database_url, schema) as queue:
        if all_failed:
            assert queue_name is not None
            ids = queue.replay_failed(queue_name, actor=actor())
            if not ids:  # (a mistyped name replayed nothing, and said so as a success)
                require_queue(queue, queue_name)
            click.echo(f"replayed {len(ids)} jobs")
            _say_failed_left(queue, queue_name)
        else:
            assert job_id is not None
            if not queue.replay(job_id, actor=actor()):
                raise InvalidArgument(f"job {job_id} is {queue.get(job_id).status}: not replayed")
            click.echo(f"replayed job {job_id}")


def _say_failed_left(queue: Queue, name: str) -> None:
    """The failed jobs a replay of them all left: "replayed 0 jobs" and exit 0,
    with the jobs still failed, read as a replay that did not work."""
    (stats,) = queue.stats(name)
    left = stats.counts[JobStatus.FAILED]
    if left:
        about = "~" if JobStatus.FAILED in stats.estimated else ""
        click.echo(
            f"{about}{left} failed jobs left as they were: failed since the replay began, "
            "held back by a unique key another job of the queue holds, or larger than the "
            "queue's limits now take (max_payload_bytes, max_queued_bytes: lowered since "
            f"they were enqueued) (`leaseq failed --queue {name}`; `leaseq replay JOB_ID` "
            "says why for one)"
        )


@cli.command()
@click.argument("job_id", type=int)
@click.option(
    "--running",
    is_flag=True,
    help="Also end a running job's claim (its handler is told; its writes are refused).",
)
@database_options
def cancel(job_id: int, running: bool, database_url: str | None, schema: str) -> None:
    """Cancel a queued job, or skip a failed one; with --running, a running one too."""
    with open_queue(database_url, schema) as queue:
        if not queue.cancel(job_id, running=running, actor=actor()):
            raise InvalidArgument(f"job {job_id} is {queue.get(job_id).status}: not cancelled")
    click.echo(f"cancelled job {job_id}")


#: Jobs `leaseq reap` fails per statement (a short transaction each, as the
#: maintenance leader's batches).
REAP_BATCH = 1000
#: The job ids it lists at most (as many as one batch listed before).
REAP_SHOWN = 1000


@cli.command()
@database_options
def reap(database_url: str | None, schema: str) -> None:
    """Fail jobs with no attempts left (queued, or running with an expired lease)."""
    failed: list[int] = []
    with open_queue(database_url, schema) as queue:
        # Batch after batch until one comes back short, as the leader reaps: one
        # reap() failed the first 1,000 and said nothing of the rest.
        while True:
            result = queue.reap(limit=REAP_BATCH)
            failed += result.failed
            if len(result) < REAP_BATCH:
                break
    shown = sorted(failed)[:REAP_SHOWN]
    more = f" and {len(failed) - len(shown)} more" if len(failed) > len(shown) else ""
    click.echo(f"failed {len(failed)} exhausted jobs" + (f": {shown}{more}" if failed else ""))


@cli.group("queue")
def queue_group() -> None:
    """Per-queue settings."""


@queue_group.command("configure")
@click.argument("name")
@click.option("--lease", type=float, default=None, help="Lease seconds.")
@click.option("--max-attempts", type=int, default=None)
@click.option("--backoff-base", type=float, default=None)
@click.option("--backoff-cap", type=float, default=None)
@click.option("--ordering-policy", type=click.Choice(["block", "continue"]), default=None)
@click.option(
    "--max-queued",
    "max_queued_jobs",
    callback=count_limit("jobs"),
    metavar="N",
    default=None,
    help="At most N unfinished jobs; enqueues beyond fail (none: no limit).",
)
@click.option(
    "--max-queued-bytes",
    callback=count_limit("bytes"),
    metavar="BYTES",
    default=None,
    help="At most BYTES of unfinished jobs' payloads (none: no limit).",
)
@click.option(
    "--max-payload-bytes",
    callback=count_limit("bytes"),
    metavar="BYTES",
    default=None,
    help="At most BYTES per job's payload (none: no limit).",
)
@click.option("--pause/--resume", "paused", default=None)
@click.option(
    "--retain-done",
    callback=duration(keep_forever=True),
    metavar="DURATION",
    default=None,
    help="Keep done jobs this long (90s, 2h, 1d, 30d; never/forever).",
)
@click.option(
    "--retain-cancelled",
    callback=duration(keep_forever=True),
    metavar="DURATION",
    default=None,
    help="Keep cancelled jobs this long.",
)
@click.option(
    "--retain-failed",
    callback=duration(keep_forever=True),
    metavar="DURATION",
    default=None,
    help="Keep failed jobs this long.",
)
@click.option(
    "--retention-mode",
    type=click.Choice(["delete", "archive"]),
    default=None,
    help="Past retention: delete, or move to the archive.",
)
@click.option(
    "--retain-archived",
    callback=duration(keep_forever=True),
    metavar="DURATION",
    default=None,
    help="Keep archived jobs this long.",
)
@click.option(
    "--max-running",
    callback=running_limit,
    metavar="N",
    default=None,
    help="At most N running jobs across all workers (none: no limit).",
)
@click.option(
    "--max-running-per-group",
    callback=running_limit,
    metavar="N",
    default=None,
    help="At most N running jobs per group (none: no limit).",
)
@click.option(
    "--rate-limit",
    callback=rate_limit,
    metavar="STARTS/DURATION",
    default=None,
    help="At most STARTS job starts in any DURATION, e.g. 50/1s (none: no limit).",
)
@click.option(
    "--rate-limit-per-group",
    callback=rate_limit,
    metavar="STARTS/DURATION",
    default=None,
    help="The same, per group.",
)
@database_options
def configure(name: str, database_url: str | None, schema: str, **settings: Any) -> None:
    """Change a queue's settings; options not given stay as they are (with none,
    show them: nothing is written to the audit log)."""
    given = {
        # NEVER: a retention kept forever; NO_LIMIT: a limit lifted. Both are None.
        key: None if value in (NEVER, NO_LIMIT) else value
        for key, value in settings.items()
        if value is not None
    }
    with open_queue(database_url, schema) as queue:
        if given:
            result = queue.configure_queue(name, actor=actor(), **given)
        else:  # only shown: a mistyped name must not make a queue
            shown = queue.queue_settings(name)
            if shown is None:
                raise InvalidArgument(
                    f"no queue named {name!r} (a queue is made by its first job, or by "
                    "`leaseq queue configure` with a setting)"
                )
            result = shown
    click.echo(
        f"queue {result.name}: lease={exact_number(result.lease)}s "
        f"max_attempts={result.max_attempts} "
        f"backoff={exact_number(result.backoff_base)}..{exact_number(result.backoff_cap)}s "
        f"ordering={result.ordering_policy.value} "
        f"max_queued={format_limit(result.max_queued_jobs)} "
        f"max_queued_bytes={format_limit(result.max_queued_bytes)} "
        f"max_payload_bytes={format_limit(result.max_payload_bytes)} paused={result.paused} "
        f"retain_done={format_duration(result.retain_done)} "
        f"retain_cancelled={format_duration(result.retain_cancelled)} "
        f"retain_failed={format_duration(result.retain_failed)} "
        f"retention_mode={result.retention_mode.value} "
        f"retain_archived={format_duration(result.retain_archived)} "
        f"max_running={format_limit(result.max_running)} "
        f"max_running_per_group={format_limit(result.max_running_per_group)} "
        f"rate_limit={format_rate(result.rate_limit)} "
        f"rate_limit_per_group={format_rate(result.rate_limit_per_group)}"
    )
