"""``leaseq audit``: the operator actions the audit log holds, newest first."""

from __future__ import annotations

import json

import click
from rich import box
from rich.table import Table

from .common import cli, console, database_options, open_queue, require_queue, shown, utc_time


@cli.command()
@click.option("--queue", "queue_name", default=None, help="Only actions on this queue.")
@click.option("--limit", default=50, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@database_options
def audit(
    queue_name: str | None, limit: int, as_json: bool, database_url: str | None, schema: str
) -> None:
    """Who replayed, cancelled, paused or reconfigured what, and when."""
    with open_queue(database_url, schema) as queue:
        entries = queue.audit_log(queue=queue_name, limit=limit)
        if not entries:  # (a mistyped name: "nothing was done to it", exit 0)
            require_queue(queue, queue_name)
    if as_json:
        click.echo(
            json.dumps(
                [
                    {
                        "audit_id": e.audit_id,
                        "at": utc_time(e.at),
                        "actor": e.actor,
                        "db_role": e.db_role,
                        "action": e.action,
                        "queue": e.queue,
                        "job_ids": list(e.job_ids),
                        "detail": e.detail,
                    }
                    for e in entries
                ]
            )
        )
        return
    table = Table(
        "#", "at", "actor", "db role", "action", "queue", title="audit log", box=box.SIMPLE_HEAD
    )
    table.add_column("jobs / detail", overflow="fold")
    for e in entries:
        ids = ", ".join(map(str, e.job_ids[:10]))
        if len(e.job_ids) > 10:  # (--json lists them all)
            ids += f" ... ({len(e.job_ids)} jobs)"
        table.add_row(
            str(e.audit_id),
            utc_time(e.at, "seconds"),
            shown(e.actor),
            shown(e.db_role or "-"),  # (rows older than migration 0024 have none)
            e.action,
            e.queue or "-",
            shown(ids or json.dumps(e.detail)),
        )
    console.print(table)
