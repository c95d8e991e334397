"""Commands about the schema's health: `leaseq health` and `leaseq explain`."""

from __future__ import annotations

import dataclasses
import json
from datetime import datetime
from typing import Any

import click
from rich import box
from rich.table import Table

from leaseq import ClaimPlan, Health, NotMigrated

from .common import (
    cli,
    console,
    database_options,
    open_queue,
    printable,
    require_queue,
    shown,
    utc_time,
)


@cli.command()
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option(
    "--long-transaction",
    type=float,
    default=60.0,
    show_default=True,
    help="Seconds a transaction may hold back cleanup before it is warned about.",
)
@database_options
def health(as_json: bool, long_transaction: float, database_url: str | None, schema: str) -> None:
    """Table and index sizes, dead rows, vacuum, what holds back cleanup; warnings."""
    with open_queue(database_url, schema) as queue:
        report = queue.health(long_transaction=long_transaction)
    if not any(table.name == "job" for table in report.tables):
        # Queue.health() reports this as a warning; a command fails on it, as
        # `status` does, and prints no report about a job table that is not there.
        raise NotMigrated(f"schema {schema!r} has no job table: run `leaseq migrate`")
    if as_json:
        click.echo(json.dumps(dataclasses.asdict(report), indent=2, default=_json_value))
    else:
        _print_health(report)
    if report.migrations_missing:
        # Reported (its tables are there), but no health check may pass a schema
        # every worker of this code refuses.
        raise NotMigrated(report.warnings[0])


@cli.command()
@click.option("--queue", "queue_name", default=None, help="Default: every queue.")
@database_options
def explain(queue_name: str | None, database_url: str | None, schema: str) -> None:
    """The live plan of the claim statement (EXPLAIN; nothing is claimed)."""
    with open_queue(database_url, schema) as queue:
        require_queue(queue, queue_name)
        names = [queue_name] if queue_name else [s.queue for s in queue.stats()]
        plans = [queue.explain_claim(name) for name in names]
    if not plans:
        click.echo("no queues yet")
    for plan in plans:
        _print_plan(plan)


def _json_value(value: object) -> Any:
    if isinstance(value, datetime):
        return utc_time(value)
    raise TypeError(f"not JSON: {value!r}")


def _size(count: int) -> str:
    size = float(count)
    for unit in ("B", "kB", "MB", "GB"):
        if size < 1024 or unit == "GB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} TB"  # pragma: no cover - the loop returns at GB


def _when(value: datetime | None) -> str:
    return utc_time(value, "seconds") or "never"


def _last(manual: datetime | None, auto: datetime | None) -> str:
    newest = max((v for v in (manual, auto) if v is not None), default=None)
    kind = "" if newest is None else (" (auto)" if newest == auto else " (manual)")
    return _when(newest) + kind


def _print_health(report: Health) -> None:
    tables = Table(title="tables", box=box.SIMPLE_HEAD)
    for heading in ("table", "total", "indexes", "live", "dead", "last vacuum", "last analyze"):
        left = heading.startswith(("table", "last"))
        tables.add_column(heading, justify="left" if left else "right")
    # Names shown(), never markup: a session's application_name (a prepared
    # transaction's gid) is anyone's text, and rich would read "[/]" in it as a tag.
    for t in report.tables:
        tables.add_row(
            shown(t.name + ("" if t.autovacuum_enabled else " (autovacuum off)")),
            _size(t.total_bytes),
            _size(t.index_bytes),
            f"{t.live_tuples:,}",
            f"{t.dead_tuples:,}",
            _last(t.last_vacuum, t.last_autovacuum),
            _last(t.last_analyze, t.last_autoanalyze),
        )
    console.print(tables)
    indexes = Table(title="indexes", box=box.SIMPLE_HEAD)
    for heading in ("table", "index", "size", "scans"):
        indexes.add_column(heading, justify="right" if heading in ("size", "scans") else "left")
    for i in report.indexes:
        indexes.add_row(shown(i.table), shown(i.name), _size(i.bytes), f"{i.scans:,}")
    console.print(indexes)
    if report.holders:
        holders = Table(title="holding back cleanup (oldest first)", box=box.SIMPLE_HEAD)
        for heading in ("what", "state", "open for", "xmin age"):
            holders.add_column(heading)
        for h in report.holders:
            held = "-" if h.held_seconds is None else f"{h.held_seconds:.0f}s"
            holders.add_row(shown(f"{h.kind} {h.name}"), shown(h.state), held, f"{h.xmin_age:,}")
        console.print(holders)
    autovacuum = "on" if report.server_autovacuum else "off"
    job = report.table("job")
    if report.leader_vacuums:
        care = "the maintenance leader vacuums the job table itself"
    elif report.server_autovacuum and job is not None and job.autovacuum_enabled:
        care = "the job table is vacuumed by autovacuum"
    else:  # autovacuum is off for it, and this role may not vacuum it (a warning says)
        care = "nothing this role runs may vacuum the job table"
    click.echo(f"autovacuum: {autovacuum} for the server; {care}")
    if not report.warnings:
        click.echo("no warnings")
    for warning in report.warnings:
        click.echo(f"warning: {printable(warning)}")


def _print_plan(plan: ClaimPlan) -> None:
    if plan.coordinated:
        verdict = "picked by claim_limited() (limits or groups), not shown by this plan"
    elif plan.reads_ready_index:
        verdict = "reads the ready index"
    else:
        verdict = "does NOT read the ready index"
    click.echo(f"claim of queue {plan.queue!r}: {verdict}")
    click.echo(plan.plan)
    for warning in plan.warnings:
        click.echo(f"warning: {printable(warning)}")
    click.echo()
