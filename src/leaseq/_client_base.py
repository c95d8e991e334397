"""What both clients share: the schema's store, the DSN, the queues known to exist."""

from __future__ import annotations

from . import _metrics
from ._config import database_url
from ._metrics import Metrics
from ._store import Store


class ClientBase:
    def __init__(
        self,
        dsn: str | None = None,
        *,
        schema: str = "leaseq",
        max_payload_bytes: int | None = None,
        notify: bool = True,
        metrics: Metrics | None = _metrics.DEFAULT,
    ) -> None:
        self._store = Store(schema, max_payload_bytes=max_payload_bytes, notify=notify)
        #: The database's URL (with its password: do not log it; leaseq redacts it).
        self.dsn = database_url(dsn)
        # Queues whose settings row is known to be committed (see _steps.enqueue).
        self._known_queues: set[str] = set()
        #: Where enqueues are counted (leaseq_jobs_enqueued_total); None: nowhere.
        self.metrics = metrics

    def _count_enqueued(self, queue: str, jobs: int) -> None:
        if self.metrics is not None:
            self.metrics.queue(queue).enqueued.inc(jobs)

    @property
    def schema(self) -> str:
        """The schema leaseq's tables live in."""
        return self._store.schema
