"""The ``leaseq`` command: a thin shell over the client, worker and maintenance.

Its rooms: ``common`` (the group, database options, errors, output), ``serving``
(what the long-running commands share), ``running``
(migrate, worker, maintenance, demo), ``jobs`` (enqueue, status, replay,
cancel, reap, queue configure), ``job_view`` (job, failed), ``retention`` (prune), ``health``
(health, explain), ``audit`` and ``embedded`` (the embedded server: status, stop).
"""

from __future__ import annotations

from . import (  # noqa: F401 - registers their commands on the group
    audit,
    dashboard,
    embedded,
    health,
    job_view,
    jobs,
    retention,
    running,
    schedules,
)
from .common import cli, scrubbed_crash

__all__ = ["cli", "main"]


def main() -> None:
    with scrubbed_crash():
        cli()


if __name__ == "__main__":
    main()
