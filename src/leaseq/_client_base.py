"""What both clients share: the schema's store, the DSN, the queues known to exist,
and the checks of their constructors' options."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from . import _metrics
from . import _validate as validate
from ._config import database_url
from ._db import with_statement_timeout
from ._errors import InvalidArgument
from ._metrics import Metrics
from ._store import Store

#: The longest statement_timeout and connect_timeout: a day is a unit mistake.
MAX_TIMEOUT_SECONDS = 86400.0


def pool_options(
    *,
    pool_size: object,
    connection_options: object,
    connect_timeout: object,
    statement_timeout: object,
) -> dict[str, Any] | None:
    """The pool's connection settings (None: leaseq's own), every pool option of
    the constructor checked first: a bad one must fail where it was given, not at
    the first call (or never: a NaN connect_timeout waited for ever)."""
    validate.positive_int(pool_size, "pool_size")
    validate.seconds(connect_timeout, "connect_timeout", MAX_TIMEOUT_SECONDS, allow_zero=False)
    if connection_options is not None and (
        not isinstance(connection_options, Mapping)
        or not all(isinstance(key, str) for key in connection_options)
    ):
        # They become psycopg.connect()'s keyword arguments.
        raise InvalidArgument(
            "connection_options must be a mapping of connection keywords, "
            f"got {connection_options!r}"
        )
    options = None if connection_options is None else dict(connection_options)
    if statement_timeout is None:  # no timeout
        return options
    # 0 is no "no timeout": the server would take it as one, so it became 1 ms.
    seconds = validate.seconds(
        statement_timeout, "statement_timeout", MAX_TIMEOUT_SECONDS, allow_zero=False
    )
    return with_statement_timeout(options, seconds)


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
        # Before the DSN is looked up: with none given, that starts a server.
        validate.dsn(dsn, "dsn")
        _metrics.checked(metrics)
        # A truthy string ("no") would turn notifications on.
        validate.flag(notify, "notify")
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
