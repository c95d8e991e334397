"""Which database leaseq uses: the one place that decides, for library, CLI and tests.

In order: an explicit URL (``--database-url`` / ``dsn=``), ``LEASEQ_DATABASE_URL``,
``DATABASE_URL``; else an embedded PostgreSQL kept under ``.leaseq/`` in the
working directory. leaseq never guesses ``localhost:5432``.

Every URL decided here is remembered by :mod:`leaseq._redact`, so its password
never appears in what leaseq prints, logs, stores or raises.
"""

from __future__ import annotations

import os
from pathlib import Path

from ._redact import remember_dsn

ENV_VARIABLES = ("LEASEQ_DATABASE_URL", "DATABASE_URL")
EMBEDDED_DIRECTORY = ".leaseq"


def configured_database_url(explicit: str | None = None) -> str | None:
    """The URL the user asked for, if any."""
    # Blank is unset, as empty is: libpq reads a URL of spaces as no setting at all
    # and connects wherever its defaults point (a server leaseq would have guessed).
    given = [url for url in (explicit, *map(os.environ.get, ENV_VARIABLES)) if url and url.strip()]
    for url in given:  # the ones not chosen are this process's secrets all the same
        remember_dsn(url)
    return given[0] if given else None


def database_url(
    explicit: str | None = None, *, base: Path | None = None, keep_running: bool = True
) -> str:
    """The URL to use, starting the embedded server when nothing is configured.

    ``keep_running`` leaves the embedded server up after this process exits, so
    later commands reuse it; tests pass False to stop it with the last user.
    """
    configured = configured_database_url(explicit)
    if configured is not None:
        return configured
    # Imported late: only the embedded case needs pgserver and its dependencies.
    from ._embedded import start_embedded  # noqa: PLC0415

    url = start_embedded((base or Path.cwd()) / EMBEDDED_DIRECTORY, keep_running=keep_running)
    remember_dsn(url)
    return url
