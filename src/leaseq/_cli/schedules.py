"""``leaseq schedules``: every periodic job with its last and next tick;
``leaseq remove-schedule``: one taken out of the app."""

from __future__ import annotations

import json

import click
from rich import box
from rich.table import Table

from leaseq import InvalidArgument

from .common import actor, cli, console, database_options, open_queue, shown, utc_time


@cli.command()
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@database_options
def schedules(as_json: bool, database_url: str | None, schema: str) -> None:
    """Periodic jobs: when they tick, the last and next tick, what was enqueued or skipped.

    A next tick marked overdue is a minute or more past due: no running worker
    declares the schedule (taken out of the app? see remove-schedule), or its
    queue is full."""
    with open_queue(database_url, schema) as queue:
        found = queue.schedules()
    if as_json:
        click.echo(
            json.dumps(
                [
                    {
                        "name": s.name,
                        "queue": s.queue,
                        "spec": s.spec,
                        "tz": s.tz,
                        "last_tick": utc_time(s.last_tick),
                        "next_tick": utc_time(s.next_tick),
                        "enqueued": s.enqueued,
                        "skipped": s.skipped,
                        "paused_ticks": s.paused_ticks,
                        "last_job_id": s.last_job_id,
                        "queue_paused": s.queue_paused,
                        "overdue_seconds": s.overdue_seconds,
                    }
                    for s in found
                ]
            )
        )
        return
    table = Table(
        "name", "queue", "when", "tz", "last tick", "next tick", "enqueued", "skipped", "paused",
        title="schedules", box=box.SIMPLE_HEAD,
    )  # fmt: skip
    for s in found:
        table.add_row(
            shown(s.name),
            shown(s.queue + (" (paused)" if s.queue_paused else "")),
            shown(s.spec.removeprefix("cron ")),
            s.tz,
            utc_time(s.last_tick, "seconds") or "-",
            str(utc_time(s.next_tick, "seconds")) + (" (overdue)" if s.stalled else ""),
            str(s.enqueued),
            str(s.skipped),
            str(s.paused_ticks),
        )
    console.print(table)


@cli.command("remove-schedule")
@click.argument("name")
@database_options
def remove_schedule(name: str, database_url: str | None, schema: str) -> None:
    """Remove a schedule the app no longer declares, with its bookkeeping (audited)."""
    with open_queue(database_url, schema) as queue:
        if not queue.remove_schedule(name, actor=actor()):
            raise InvalidArgument(f"no schedule {name!r}")
    click.echo(f"removed schedule {name!r}")
