"""Prometheus metrics: leaseq's instruments, and the database's gauges read on scrape.

A :class:`Metrics` holds every instrument on one prometheus-client registry.
``leaseq.metrics`` is the process's own, on prometheus-client's default
``REGISTRY`` (so an application that already serves that registry serves
leaseq's numbers too); the clients count enqueues on it and the worker counts
what it does, unless given another one (or None: no metrics).

* Counters and histograms are counted where things happen: the producer's
  enqueue (once its statement succeeded), the worker's claim loop and attempts.
  Per queue, the labelled children are bound once (:meth:`Metrics.queue`), so a
  job costs a few uncontended lock round trips, no label lookup.
* The database's gauges come from a collector that runs the client's
  ``stats()`` on scrape: one statement, at most once per ``ttl`` seconds
  however many scrapers ask (see :meth:`Metrics.watch`).
* ``leaseq_worker_running_jobs`` is read on scrape from the workers that track
  themselves here: nothing is counted per job.

Labels are ``queue``, ``outcome`` and ``state`` only (never a job id); every
duration is in seconds.
"""

from __future__ import annotations

import asyncio
import inspect
import threading
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from dataclasses import dataclass
from typing import Any
from wsgiref.simple_server import WSGIServer

from prometheus_client import (
    REGISTRY,
    CollectorRegistry,
    Counter,
    Histogram,
    generate_latest,
    start_http_server,
)
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.exposition import choose_encoder

from . import _validate as validate
from ._errors import InvalidArgument
from ._gauges import DEFAULT_TTL, DatabaseGauges, StatsSource
from ._logs import get_logger

log = get_logger("leaseq.metrics")

#: The longest ttl of the database's gauges: past a day they would be stale, not cached.
MAX_TTL_SECONDS = 86400.0

#: How a job's attempt ended, as ``leaseq_jobs_finished_total`` labels it: what the
#: database did (a retry of a job with no attempts left is ``failed``).
OUTCOMES = ("done", "retried", "failed", "released", "lease_lost")

#: The first ten buckets of the job histograms: 5 ms to 5 s.
_SUBSECOND = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5)
#: Handler run times: from 5 ms to an hour.
DURATION_BUCKETS = (*_SUBSECOND, 10, 30, 60, 120, 300, 600, 1800, 3600)
#: Ready until claimed: from 5 ms to a day.
WAIT_BUCKETS = (*_SUBSECOND, 10, 30, 60, 300, 900, 3600, 21600, 86400)
#: One claim call, as the worker waited for it: from 0.5 ms to 5 s.
CLAIM_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5)


@dataclass(frozen=True, slots=True)
class QueueInstruments:
    """One queue's labelled children, bound once."""

    enqueued: Counter
    finished: dict[str, Counter]  # by outcome
    recovered: Counter
    claims: Counter
    job_duration: Histogram
    job_wait: Histogram
    claim_duration: Histogram


class Metrics:
    """leaseq's Prometheus instruments on one registry (a fresh one by default).

    ``leaseq.metrics`` is the process's, on prometheus-client's default registry.
    Give a ``Metrics`` to ``Queue(metrics=...)``/``Worker(metrics=...)`` to count on
    another registry, or None to count nothing.
    """

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        if registry is not None and not isinstance(registry, CollectorRegistry):
            raise InvalidArgument(
                f"registry must be a prometheus_client CollectorRegistry or None, got {registry!r}"
            )
        self.registry = CollectorRegistry() if registry is None else registry
        reg = self.registry
        self._enqueued = Counter(
            "leaseq_jobs_enqueued",
            "Jobs enqueued (counted once the statement succeeded).",
            ["queue"],
            registry=reg,
        )
        self._finished = Counter(
            "leaseq_jobs_finished",
            "Attempts ended, by what the database did: done, retried, failed, released "
            "(given back at shutdown) or lease_lost (the worker no longer held the job).",
            ["queue", "outcome"],
            registry=reg,
        )
        self._recovered = Counter(
            "leaseq_leases_recovered",
            "Claims that took over an expired lease.",
            ["queue"],
            registry=reg,
        )
        self._claims = Counter(
            "leaseq_claim_statements", "Claim calls the worker made.", ["queue"], registry=reg
        )
        self._job_duration = Histogram(
            "leaseq_job_duration_seconds",
            "Handler run time.",
            ["queue"],
            buckets=DURATION_BUCKETS,
            registry=reg,
        )
        self._job_wait = Histogram(
            "leaseq_job_wait_seconds",
            "Ready until claimed (available_at, or the expired lease's end, to claimed_at; "
            "database times).",
            ["queue"],
            buckets=WAIT_BUCKETS,
            registry=reg,
        )
        self._claim_duration = Histogram(
            "leaseq_claim_duration_seconds",
            "Time spent in one claim call.",
            ["queue"],
            buckets=CLAIM_BUCKETS,
            registry=reg,
        )
        self._queues: dict[str, QueueInstruments] = {}
        self._bind_lock = threading.Lock()
        self._running = _RunningJobs()
        self._database = DatabaseGauges()
        self.registry.register(self._running)
        self.registry.register(self._database)

    # -- counting -----------------------------------------------------------------

    def queue(self, name: str) -> QueueInstruments:
        """The instruments of one queue (bound on first use, then reused)."""
        found = self._queues.get(name)
        if found is None:
            with self._bind_lock:
                found = self._queues.get(name)
                if found is None:
                    found = self._queues[name] = QueueInstruments(
                        enqueued=self._enqueued.labels(name),
                        finished={o: self._finished.labels(name, o) for o in OUTCOMES},
                        recovered=self._recovered.labels(name),
                        claims=self._claims.labels(name),
                        job_duration=self._job_duration.labels(name),
                        job_wait=self._job_wait.labels(name),
                        claim_duration=self._claim_duration.labels(name),
                    )
        return found

    def track_running(self, count: Callable[[], int]) -> Callable[[], None]:
        """Add ``count()`` (a worker's running jobs) to ``leaseq_worker_running_jobs``
        at every scrape; returns the function that stops it."""
        return self._running.add(count)

    # -- the database's gauges ---------------------------------------------------------

    def watch(self, source: StatsSource | None, *, ttl: float = DEFAULT_TTL) -> None:
        """Serve the database's gauges from ``source.stats()`` (a ``leaseq.Queue``; its
        schema's queues), run on scrape at most once per ``ttl`` seconds; None stops.

        Scrapes are answered in a thread of their own (:meth:`serve`,
        :meth:`asgi_app`): watch a sync ``Queue`` (with a small pool of its own),
        not an ``AsyncQueue``."""
        if source is not None and not (
            callable(getattr(source, "stats", None)) and callable(getattr(source, "health", None))
        ):
            raise InvalidArgument(f"watch a leaseq.Queue (or None), got {source!r}")
        if source is not None and inspect.iscoroutinefunction(source.stats):
            raise InvalidArgument("watch a leaseq.Queue: scrapes call stats() from a thread")
        # NaN compared false with every age: each scrape read the database.
        self._database.watch(source, validate.seconds(ttl, "ttl", MAX_TTL_SECONDS))

    # -- exposing ------------------------------------------------------------------------

    def serve(self, port: int, host: str = "127.0.0.1") -> MetricsServer:
        """Serve ``/metrics`` over HTTP from a daemon thread (port 0: any free port)."""
        # The socket's own errors for a port out of range were no InvalidArgument
        # (-1: socket.gaierror, 70000: OverflowError).
        if not isinstance(host, str) or not host:
            raise InvalidArgument(f"host must be an address or a host name, got {host!r}")
        server, thread = start_http_server(validate.port(port), addr=host, registry=self.registry)
        return MetricsServer(server, thread)

    def text(self) -> str:
        """The registry in Prometheus' text format (what ``/metrics`` answers)."""
        return generate_latest(self.registry).decode()

    def asgi_app(self) -> ASGIApp:
        """An ASGI app answering ``/metrics`` scrapes, for an application's own
        server (``app.mount("/metrics", leaseq.metrics.asgi_app())``). The
        registry is rendered in a thread: the database gauges' read (a stats
        query, which waits behind a lock on the job table) never holds the
        event loop, as prometheus-client's ``make_asgi_app`` would."""
        return _ScrapeApp(self.registry)


def checked(metrics: object) -> Metrics | None:
    """A ``metrics=`` option as given, if it is a :class:`Metrics` or None: anything
    else failed only at its first use, after the enqueue it counts had committed."""
    if metrics is not None and not isinstance(metrics, Metrics):
        raise InvalidArgument(
            "metrics must be a leaseq.Metrics (leaseq.Metrics(registry) for a registry "
            f"of your own) or None, got {metrics!r}"
        )
    return metrics


ASGIApp = Callable[
    [
        MutableMapping[str, Any],
        Callable[[], Awaitable[MutableMapping[str, Any]]],
        Callable[[MutableMapping[str, Any]], Awaitable[None]],
    ],
    Awaitable[None],
]


class _ScrapeApp:
    """The ASGI app of :meth:`Metrics.asgi_app`."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self._registry = registry

    async def __call__(
        self,
        scope: MutableMapping[str, Any],
        receive: Callable[[], Awaitable[MutableMapping[str, Any]]],
        send: Callable[[MutableMapping[str, Any]], Awaitable[None]],
    ) -> None:
        if scope["type"] == "lifespan":  # served on its own, not mounted
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        if scope["type"] != "http":
            raise InvalidArgument(f"the metrics app serves HTTP, not {scope['type']!r}")
        accept = ",".join(
            value.decode("latin-1")
            for name, value in scope.get("headers", ())
            if name.decode("latin-1").lower() == "accept"
        )
        encoder, content_type = choose_encoder(accept)
        body = await asyncio.to_thread(encoder, self._registry)
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", content_type.encode("latin-1"))],
            }
        )
        await send({"type": "http.response.body", "body": body})


class MetricsServer:
    """A running ``/metrics`` HTTP server; ``close()`` stops it."""

    def __init__(self, server: WSGIServer, thread: threading.Thread) -> None:
        self._server = server
        self._thread = thread
        self.host, self.port = server.server_address[:2]

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)


class _RunningJobs:
    """``leaseq_worker_running_jobs``: the sum of the tracked workers' counts, on scrape."""

    def __init__(self) -> None:
        self._counts: dict[int, Callable[[], int]] = {}
        self._next = 0
        self._lock = threading.Lock()

    def add(self, count: Callable[[], int]) -> Callable[[], None]:
        with self._lock:
            key, self._next = self._next, self._next + 1
            self._counts[key] = count

        def remove() -> None:
            with self._lock:
                self._counts.pop(key, None)

        return remove

    def describe(self) -> Iterable[Metric]:
        return [self._family()]

    def collect(self) -> Iterable[Metric]:
        with self._lock:
            counts = list(self._counts.values())
        family = self._family()
        family.add_metric([], sum(count() for count in counts))
        return [family]

    @staticmethod
    def _family() -> GaugeMetricFamily:
        return GaugeMetricFamily(
            "leaseq_worker_running_jobs",
            "Attempts this process's workers are running (their handlers not yet returned).",
        )


#: The process's metrics, on prometheus-client's default registry.
DEFAULT = Metrics(REGISTRY)
