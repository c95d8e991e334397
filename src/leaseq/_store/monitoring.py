"""Operations of monitoring: the per-queue numbers operators, ``leaseq status`` and
the metrics scrape read, at a cost that does not grow with the finished rows."""

from __future__ import annotations

from .. import _decoding as decoding
from .. import _validate as validate
from .._statement import Operation, Statement
from .._types import QueueStats
from .base import StoreBase

#: Up to this many pages (8 MiB) the job table is scanned to count finished jobs
#: exactly; past it they are estimated without reading a job row.
EXACT_FINISHED_PAGES = 1024


class MonitoringOperations(StoreBase):
    """What a scrape, the CLI's status and a dashboard read."""

    def stats(self, queue: str | None = None) -> Operation[list[QueueStats]]:
        """Per queue (all, or ``queue``): one statement. Unfinished counts are exact
        (partial indexes); finished ones of a large table are estimates, named in
        :attr:`QueueStats.estimated` (see ``stats.sql``)."""
        params = {
            "queue": None if queue is None else validate.queue_name(queue),
            "schema": self.schema,
            "exact_pages": EXACT_FINISHED_PAGES,
        }
        return Operation(
            (Statement(self.sql("stats.sql"), params),),
            lambda r: [decoding.stats_from_row(row) for row in r[0]],
        )

    def queue_names(self) -> Operation[list[str]]:
        """The schema's queues, sorted: what ``stats()`` lists, reading no job."""
        return Operation(
            (Statement(self.sql("queue_names.sql")),),
            lambda r: [str(row[0]) for row in r[0]],
        )
