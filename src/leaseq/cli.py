"""The ``leaseq`` command: a thin shell over the client."""

from __future__ import annotations

import sys

import click

from .client import Queue
from .errors import LeaseqError


@click.group()
@click.option(
    "--database-url",
    envvar="LEASEQ_DATABASE_URL",
    default=None,
    help="PostgreSQL URL (else $LEASEQ_DATABASE_URL, $DATABASE_URL, embedded server).",
)
@click.option("--schema", default="leaseq", show_default=True, help="leaseq's schema.")
@click.pass_context
def cli(ctx: click.Context, database_url: str | None, schema: str) -> None:
    """leaseq: background jobs on PostgreSQL."""
    ctx.obj = {"database_url": database_url, "schema": schema}


@cli.command()
@click.pass_context
def migrate(ctx: click.Context) -> None:
    """Create or upgrade leaseq's schema."""
    with Queue(ctx.obj["database_url"], schema=ctx.obj["schema"]) as queue:
        applied = queue.migrate()
    click.echo(f"applied migrations: {applied}" if applied else "schema is up to date")


def main() -> None:
    try:
        cli(standalone_mode=True)
    except LeaseqError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(1)
