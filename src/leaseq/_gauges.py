"""The database's gauges, read on scrape: one ``stats()`` and one ``health()`` of a
(sync) client per ``ttl`` at most, shared by concurrent scrapes; when the read
fails, ``leaseq_queue_stats_up`` is 0 and no stale number is served."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Iterator
from typing import Protocol

from prometheus_client.core import GaugeMetricFamily, Metric

from ._health_types import Health
from ._logs import get_logger
from ._types import JobStatus, QueueStats

log = get_logger("leaseq.metrics")

#: Seconds a scrape's database numbers are reused by the next scrapes.
DEFAULT_TTL = 5.0

ESTIMATES_HELP = (
    "queued and running are exact; done and cancelled are estimates once the job table "
    "is past 8 MiB, failed past 10,000 per queue (leaseq_queue_jobs_estimated says which)"
)


class StatsSource(Protocol):
    """What the database gauges read: a (sync) client's ``stats()`` and ``health()``,
    e.g. ``leaseq.Queue``."""

    def stats(self, queue: str | None = None) -> list[QueueStats]: ...

    def health(self, *, long_transaction: float = 60.0) -> Health: ...


class DatabaseGauges:
    """The database's gauges: one ``stats()`` per ``ttl`` at most, shared by scrapes."""

    def __init__(self) -> None:
        self._source: StatsSource | None = None
        self._ttl = DEFAULT_TTL
        self._lock = threading.Lock()  # one query at a time; concurrent scrapes wait for it
        self._read_at = float("-inf")
        self._stats: list[QueueStats] | None = None
        self._health: Health | None = None

    def watch(self, source: StatsSource | None, ttl: float) -> None:
        with self._lock:
            self._source, self._ttl = source, ttl
            self._read_at, self._stats, self._health = float("-inf"), None, None

    def _current(self) -> tuple[bool, list[QueueStats] | None, Health | None]:
        """(watching, the stats and the table health: fresh or at most ttl old; None
        where the query failed)."""
        with self._lock:
            if self._source is None:
                return False, None, None
            if time.monotonic() - self._read_at >= self._ttl:
                try:
                    self._stats = self._source.stats()
                    self._health = self._source.health()
                except Exception as exc:
                    log.warning("metrics: reading the queues' stats failed: %s", exc)
                    self._stats = self._health = None
                # The ttl counts from the read's end: scrapes that waited for a slow
                # read share it, and a database slower than the ttl is not queried
                # back to back.
                self._read_at = time.monotonic()
            return True, self._stats, self._health

    def describe(self) -> Iterable[Metric]:
        return [_up_family(), *_families(), *_table_families()]

    def collect(self) -> Iterable[Metric]:
        watching, stats, health = self._current()
        if not watching:
            return []
        up = _up_family()
        up.add_metric([], 0.0 if stats is None else 1.0)
        if stats is None or health is None:
            return [up]
        table = list(_table_gauges(health))
        jobs, estimated, size, oldest, expired, paused = _families()
        for s in stats:
            for state in JobStatus:
                jobs.add_metric([s.queue, state.value], s.counts[state])
                estimated.add_metric([s.queue, state.value], float(state in s.estimated))
            size.add_metric([s.queue], s.queued_bytes)
            oldest.add_metric([s.queue], s.oldest_ready_age or 0.0)
            expired.add_metric([s.queue], s.expired_leases)
            paused.add_metric([s.queue], float(s.paused))
        return [up, jobs, estimated, size, oldest, expired, paused, *table]


def _up_family() -> GaugeMetricFamily:
    return GaugeMetricFamily(
        "leaseq_queue_stats_up", "1 if the last read of the database's numbers succeeded."
    )


def _families() -> Iterator[GaugeMetricFamily]:
    yield GaugeMetricFamily(
        "leaseq_queue_jobs",
        f"Jobs by queue and state: {ESTIMATES_HELP}.",
        labels=["queue", "state"],
    )
    yield GaugeMetricFamily(
        "leaseq_queue_jobs_estimated",
        "1 where leaseq_queue_jobs is a planner-statistics estimate, 0 where it is exact.",
        labels=["queue", "state"],
    )
    yield GaugeMetricFamily(
        "leaseq_queue_bytes", "Payload bytes of the queued jobs (exact).", labels=["queue"]
    )
    yield GaugeMetricFamily(
        "leaseq_queue_oldest_ready_age_seconds",
        "Age of the oldest job a worker could claim now, 0 if none (exact; a key's "
        "waiting jobs are not ready; 0 while the queue is paused).",
        labels=["queue"],
    )
    yield GaugeMetricFamily(
        "leaseq_queue_expired_leases",
        "Running jobs whose lease has expired, awaiting recovery (exact).",
        labels=["queue"],
    )
    yield GaugeMetricFamily(
        "leaseq_queue_paused", "1 while the queue is paused, else 0.", labels=["queue"]
    )


def _table_families() -> Iterator[GaugeMetricFamily]:
    yield GaugeMetricFamily(
        "leaseq_job_table_dead_tuples",
        "Dead row versions in the job table (the server's statistics, a moment behind).",
    )
    yield GaugeMetricFamily(
        "leaseq_job_table_bytes", "Size of the job table with its indexes and TOAST, in bytes."
    )
    yield GaugeMetricFamily(
        "leaseq_cleanup_held_back_seconds",
        "How long the oldest open transaction that holds back VACUUM in this database "
        "has been open, 0 if none (leaseq health names it).",
    )


def _table_gauges(health: Health) -> Iterator[GaugeMetricFamily]:
    job = health.table("job")
    if job is None:
        return
    dead, size, held = _table_families()
    dead.add_metric([], job.dead_tuples)
    size.add_metric([], job.total_bytes)
    held.add_metric([], max((h.held_seconds or 0.0 for h in health.holders), default=0.0))
    yield from (dead, size, held)
