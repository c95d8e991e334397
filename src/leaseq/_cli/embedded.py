"""``leaseq embedded status|stop``: the PostgreSQL leaseq keeps under ``./.leaseq/``
when no database URL is set (started by the first command that needs it, and
kept running for the next ones)."""

from __future__ import annotations

from pathlib import Path

import click

from .._config import EMBEDDED_DIRECTORY, configured_database_url
from .._embedded import embedded_running, stop_embedded
from .common import cli


def _here() -> Path:
    return Path.cwd() / EMBEDDED_DIRECTORY


def _configured_note() -> str:
    # The embedded server is this folder's, whatever the URL: say which one the
    # other commands use, or stopping it may look like it stopped theirs.
    if configured_database_url() is None:
        return ""
    return " (a database URL is set: the other commands use that one, not this server)"


@cli.group("embedded")
def embedded_group() -> None:
    """The embedded PostgreSQL of this folder (./.leaseq/): status, stop."""


@embedded_group.command("status")
def status() -> None:
    """Whether this folder's embedded PostgreSQL runs (exit 0 if it does, 3 if not)."""
    directory = _here()
    if embedded_running(directory):
        click.echo(f"the embedded PostgreSQL in {directory} is running{_configured_note()}")
        return
    made = (directory / "pgdata").exists()
    where = f"in {directory}" if made else f"in {directory} (none was made here)"
    click.echo(f"no embedded PostgreSQL is running {where}{_configured_note()}")
    raise SystemExit(3)  # pg_ctl status's code for "not running"


@embedded_group.command("stop")
def stop() -> None:
    """Stop this folder's embedded PostgreSQL; its data stays for the next start.

    Sessions still open on it (a worker) are ended; the next leaseq command run
    here starts it again."""
    directory = _here()
    if stop_embedded(directory):
        click.echo(f"stopped the embedded PostgreSQL in {directory}{_configured_note()}")
    else:
        click.echo(f"no embedded PostgreSQL is running in {directory}{_configured_note()}")
