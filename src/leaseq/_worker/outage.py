"""One account of the database going away in the worker's log: a line when it
goes, one when it answers again.

Each service retries on its own (claims, renewals, acknowledgements, LISTEN),
and each of its retries said so in a line of its own, beside psycopg_pool's
line per failed connection attempt of each pool: a minute without the
database wrote ~140 lines, none of them saying that the database was away nor
when it came back. Now the first failure says it (with the service and the
error), later ones go to DEBUG, and the first call answered after them says
how long it lasted. A lost lease is still said once per job: each is an
attempt whose result was dropped.
"""

from __future__ import annotations

import time

from .._logs import get_logger

log = get_logger("leaseq.worker")


class Outage:
    """Whether the worker's calls to the database are failing now, and since when."""

    def __init__(self) -> None:
        self._since: float | None = None
        self._failures = 0

    @property
    def ongoing(self) -> bool:
        return self._since is not None

    def failed(self, service: str, error: BaseException) -> None:
        """A call of ``service`` failed with a connection error; it is retried."""
        self._failures += 1
        if self._since is not None:
            log.debug("%s failed again (%s); retrying", service, error)
            return
        self._since = time.monotonic()
        log.warning(
            "database unreachable (%s: %s); retrying until it answers (claims, lease "
            "renewals and acknowledgements wait; a job whose lease cannot be renewed "
            "in time is stopped)",
            service,
            error,
        )

    def answered(self) -> None:
        """A call was answered: the end of the outage, if there was one (cheap
        otherwise: called after every claim, renewal and flush)."""
        if self._since is None:
            return
        lasted = time.monotonic() - self._since
        log.info(
            "database reachable again after %.1fs (%d failed calls retried meanwhile)",
            lasted,
            self._failures,
        )
        self._since = None
        self._failures = 0
