"""The worker's clients: the handlers' pools, and a connection of its own for each service.

A handler's transaction may hold a pooled connection as long as it likes. So the
claim loop, the heartbeat and the acknowledgements each have a connection of
their own (they send one statement at a time): none of them ever waits for a
handler to give one back. Every client carries ``WORKER_CONNECTIONS``
(keepalives, a TCP user timeout, no long idle transactions); the services'
own sessions keep one generic plan per statement (``SERVICE_CONNECTIONS``).
With durable acknowledgements off, the acknowledgement session commits without
waiting for the WAL flush (``ASYNC_ACKNOWLEDGEMENT_CONNECTIONS``); the claims
never do.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from .._async_client import (
    ASYNC_ACKNOWLEDGEMENT_CONNECTIONS,
    SERVICE_CONNECTIONS,
    WORKER_CONNECTIONS,
    AsyncQueue,
)
from .._sync_client import Queue


@dataclass(frozen=True, slots=True)
class WorkerClients:
    handlers: Queue  # JobContext.connection() / transaction() (sync handlers)
    handlers_async: AsyncQueue  # JobContext.atransaction(); maintenance
    claims: AsyncQueue
    renewals: AsyncQueue
    acknowledgements: AsyncQueue
    listener: AsyncQueue | None  # LISTEN, on its own DSN (None: polling only)

    @classmethod
    def open(
        cls,
        dsn: str,
        schema: str,
        *,
        concurrency: int,
        listen_dsn: str | None,
        durable_acknowledgements: bool = True,
    ) -> WorkerClients:
        """The clients (their pools open on first use); ``listen_dsn`` None: no listener."""

        def own(on: str = dsn, options: dict[str, Any] = SERVICE_CONNECTIONS) -> AsyncQueue:
            return AsyncQueue(on, schema=schema, pool_size=1, connection_options=options)

        # Two connections per slot: every handler may hold its job.transaction()
        # and take a job.connection() inside it at once (with one per slot, a full
        # worker's handlers waited for each other until the pool's timeout). The
        # async pool also serves maintenance and the scheduler. Pools open their
        # connections as they are asked for, so the room costs nothing unused.
        handler_connections = 2 * concurrency
        return cls(
            handlers=Queue(
                dsn,
                schema=schema,
                pool_size=handler_connections,
                connection_options=WORKER_CONNECTIONS,
            ),
            handlers_async=AsyncQueue(
                dsn,
                schema=schema,
                pool_size=handler_connections + 2,
                connection_options=WORKER_CONNECTIONS,
            ),
            claims=own(),
            renewals=own(),
            acknowledgements=own(
                options=SERVICE_CONNECTIONS
                if durable_acknowledgements
                else ASYNC_ACKNOWLEDGEMENT_CONNECTIONS
            ),
            listener=None if listen_dsn is None else own(listen_dsn),
        )

    async def close(self, timeout: float) -> None:
        """Close every pool, all at once, ``timeout`` seconds at most: with the
        database away, each waits for its connection attempt in flight (5 s), and
        what is not closed by then is left (its connections end with the process)."""
        queues = [self.claims, self.renewals, self.acknowledgements, self.handlers_async]
        if self.listener is not None:
            queues.append(self.listener)
        closing = [asyncio.ensure_future(queue.close()) for queue in queues]
        # The sync pool's close blocks: in a thread, not on the loop.
        closing.append(asyncio.ensure_future(asyncio.to_thread(self.handlers.close)))
        _, left = await asyncio.wait(closing, timeout=timeout)
        for task in left:
            task.cancel()
