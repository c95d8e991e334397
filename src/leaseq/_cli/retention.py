"""Retention on the command line: ``leaseq prune``, and the durations that
``prune`` and ``queue configure --retain-*`` read and print."""

from __future__ import annotations

import re
from typing import Any

import click
from rich import box
from rich.table import Table

from leaseq import JobStatus, PruneResult

from .._durations import duration_text
from .common import actor, cli, console, database_options, open_queue, require_queue

#: Seconds per unit of a duration such as ``90s``, ``15m``, ``2h``, ``1d``, ``4w``.
UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
# [0-9], not \d: \d is any script's digit, which float() reads too.
_DURATION = re.compile(r"([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*([smhdw]?)")
#: What `never`/`forever` read as: keep forever (None in the library).
NEVER = "never"


def duration(*, keep_forever: bool = False) -> Any:
    """An option callback reading seconds written ``90s``, ``2h``, ``1d``, ``30d`` (a
    bare number is seconds); with ``keep_forever``, also ``never``/``forever``
    (returned as ``NEVER``). A callback rather than a ``click.ParamType``: that
    class is generic in some click versions only."""

    def convert(ctx: click.Context, param: click.Parameter, value: str | None) -> Any:
        if value is None:
            return None
        text = value.strip().lower()
        if keep_forever and text in ("never", "forever"):
            return NEVER
        match = _DURATION.fullmatch(text)
        if match is None:
            forever = ", or never/forever" if keep_forever else ""
            raise click.BadParameter(
                f"{value!r} is not a duration such as 90s, 2h, 1d, 30d{forever}", ctx, param
            )
        return float(match[1]) * UNITS[match[2] or "s"]

    return convert


def format_duration(seconds: float | None) -> str:
    """``1d``, ``2h``, ``90s``, exact (what ``duration()`` reads back); ``never``
    for None (kept forever)."""
    return duration_text(seconds, never=NEVER)


FINISHED = [state.value for state in JobStatus if state.finished]


@cli.command()
@click.option("--queue", "queue_name", default=None, help="Only this queue (default: all).")
@click.option(
    "--state",
    "states",
    multiple=True,
    type=click.Choice(FINISHED),
    help="Only jobs in this finished state (repeatable; default: all three).",
)
@click.option(
    "--older-than",
    callback=duration(),
    metavar="DURATION",
    default=None,
    help="Remove jobs finished longer ago than this instead of the queues' retention.",
)
@click.option(
    "--archived-older-than",
    callback=duration(),
    metavar="DURATION",
    default=None,
    help="Remove archived jobs archived longer ago than this instead of the queues' "
    "retain-archived.",
)
@click.option("--batch", default=1000, show_default=True, help="Jobs per transaction.")
@click.option(
    "--pause", type=float, default=0.1, show_default=True, help="Seconds between batches."
)
@click.option("--dry-run", is_flag=True, help="Count what would be removed; write nothing.")
@database_options
def prune(
    queue_name: str | None,
    states: tuple[str, ...],
    database_url: str | None,
    schema: str,
    **options: Any,
) -> None:
    """Apply retention now: remove finished jobs past their queue's retention
    (deleted, or moved to the archive), in bounded batches; print what went."""
    with open_queue(database_url, schema) as queue:
        require_queue(queue, queue_name)  # (else: removed nothing, said so as a success)
        result = queue.prune(queue_name, states=states or None, actor=actor(), **options)
    _print_prune(result)


def _print_prune(result: PruneResult) -> None:
    verb = "would remove" if result.dry_run else "removed"
    expired = sum(result.expired.values())
    click.echo(
        f"{verb} {len(result)} finished jobs"
        + (f" and {expired} archived jobs" if expired else "")
        + (" (dry run: nothing written)" if result.dry_run else "")
    )
    keys = sorted({*result.deleted, *result.archived, *result.expired})
    if not keys:
        return
    table = Table(box=box.SIMPLE_HEAD)
    for heading in ("queue", "state"):
        table.add_column(heading, no_wrap=True)
    for heading in ("deleted", "archived", "expired from archive"):
        table.add_column(heading, justify="right", no_wrap=True)
    for key in keys:
        queue, state = key
        table.add_row(
            queue,
            state.value,
            *(
                str(counts.get(key, 0))
                for counts in (result.deleted, result.archived, result.expired)
            ),
        )
    console.print(table)
