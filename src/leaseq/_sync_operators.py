"""The operators' calls for synchronous code.

GENERATED from ``_async_operators.py`` by ``tools/async_to_sync.py``: do not edit
this file; edit the async source and run the tool (``make lint`` checks it).
See ``_async_operators.py`` for what it does.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from time import monotonic
from typing import Any

from . import _steps
from . import _validate as validate
from ._db import Connection, Database
from ._errors import ResultNotReady
from ._health_types import ClaimPlan, Health
from ._store import Store
from ._types import (
    AuditEntry,
    BlockedKey,
    FailedSummary,
    Job,
    JobPage,
    JobStatus,
    PruneResult,
    QueueActivity,
    QueueSettings,
    QueueStats,
    ReapResult,
    ScheduleInfo,
)

#: How soon wait_result tries again to mark a job whose row another transaction
#: held (a claim holds it for milliseconds; a transactional completion longer).
MARK_RETRY_SECONDS = 0.05


class OperatorCalls:
    """What operators call; the client supplies its store and database."""

    _store: Store
    _db: Database

    def reap(self, *, limit: int = 1000) -> ReapResult:
        """Fail up to ``limit`` jobs with no attempts left (queued, or running with
        an expired lease). A live lease is never touched."""
        return self._db.run(self._store.reap(limit=limit))

    def replay(self, job_id: int, *, actor: str | None = None) -> bool:
        """Put a failed or cancelled job back (same id, fresh attempts): True if
        replayed, False if it was neither (a running job is never replayed: that
        would start a second run beside the first). BacklogFull if its queue has
        no room; PayloadTooLarge if its payload is larger than its queue takes now
        (``max_payload_bytes``, or its whole ``max_queued_bytes``, lowered since it
        was enqueued): it can never fit. A job cancelled while running becomes
        claimable once the lease the cancel cut short would have ended. Audited
        under ``actor``."""
        return self._db.run(self._store.replay(job_id, actor=actor))

    def replay_many(
        self,
        job_ids: Sequence[int],
        *,
        actor: str | None = None,
        only_failed: bool = False,
        lease_versions: Sequence[int] | None = None,
    ) -> list[int]:
        """Replay those of the jobs (up to 10,000) that are failed or cancelled, in one
        statement; returns their ids. ``only_failed``: those still failed only (one
        cancelled meanwhile, a skipped one say, stays cancelled; the status is
        checked on the locked row). ``lease_versions`` (one per id, the ids then
        distinct): the ``lease_version`` each job had when it was looked at; one
        that moved on since (replayed, run again, maybe failed again) is left
        alone, checked on the locked row too. So is one whose payload is larger than
        its queue takes now (it takes no room). BacklogFull (its ``replayed``
        holding what was done) if a queue had no room for some. Audited under
        ``actor``."""
        return self._db.run(
            self._store.replay_many(
                job_ids, actor=actor, only_failed=only_failed, lease_versions=lease_versions
            )
        )

    def replay_failed(
        self, queue: str, *, batch: int = 1000, actor: str | None = None
    ) -> list[int]:
        """Replay every failed job of ``queue`` in batches of short transactions;
        returns their ids. The jobs failed when it begins, each once: one that
        fails again meanwhile stays failed, and so does one whose unique key another
        job holds, or whose payload is larger than the queue takes now (it takes no
        room). A queue with admission limits takes back only what fits: then
        BacklogFull is raised, its ``replayed`` holding what was done."""
        # Here, under its own name: each batch is the store's replay ``limit``.
        validate.claim_limit(batch, "batch")
        steps = _steps.replay_failed(self._store, queue, batch=batch, actor=actor)
        return self._db.run_steps(steps)

    def cancel(
        self,
        job_id: int,
        *,
        running: bool = False,
        only_failed: bool = False,
        lease_version: int | None = None,
        actor: str | None = None,
    ) -> bool:
        """Cancel a queued job, or skip a failed one (which unblocks its ordering
        key): True if it changed. A running job is left to its owner unless
        ``running``: then its claim ends through the lease fence (the job is
        cancelled at once; its handler is told as of a lost lease, within moments
        through a notification or at its next renewal, and whatever it reports
        afterwards is refused). ``only_failed``: a skip, nothing else (a job
        replayed meanwhile stays queued; the status is checked on the locked
        row). ``lease_version``: the job's ``lease_version`` when it was looked
        at; one that moved on since (replayed, maybe run and failed again: not
        the failure that was seen) is left as it is, checked on the locked row
        too. Audited under ``actor``."""
        return self._db.run(
            self._store.cancel(
                job_id,
                running=running,
                only_failed=only_failed,
                lease_version=lease_version,
                actor=actor,
            )
        )

    def prune(
        self,
        queue: str | None = None,
        *,
        states: Iterable[JobStatus | str] | JobStatus | str | None = None,
        older_than: float | None = None,
        archived_older_than: float | None = None,
        batch: int = 1000,
        dry_run: bool = False,
        pause: float = 0.1,
        max_batches: int | None = None,
        actor: str | None = None,
    ) -> PruneResult:
        """Apply retention now: remove finished jobs (done, cancelled, failed, or
        ``states``) of every queue (or ``queue``) past their queue's retention, or
        older than ``older_than`` seconds if given; a queue in archive mode moves
        them to the archive, whose own retention (or ``archived_older_than``)
        applies too. In batches of ``batch`` jobs, each a short transaction that
        skips locked rows, ``pause`` seconds apart (so autovacuum keeps up), until
        nothing is due or ``max_batches`` ran (then ``more`` says whether some may
        be left). Queued and running jobs are never touched, nor a failed job of an
        ordering key under the ``block`` policy. ``dry_run`` counts what would go,
        writing nothing. ``actor``: an operator's prune, audited under that name
        (the ids each batch removed; the maintenance leader's retention names none)."""
        operation = self._store.prune(
            queue=queue,
            states=states,
            older_than=older_than,
            archived_older_than=archived_older_than,
            limit=batch,
            dry_run=dry_run,
            actor=actor,
        )
        pause = validate.seconds(pause, "pause", 3600.0)
        if max_batches is not None:
            validate.positive_int(max_batches, "max_batches")
        result = PruneResult(dry_run=dry_run)
        batches = 0
        while True:
            result = result.merged(self._db.run(operation))
            batches += 1
            if not result.more or batches == max_batches:
                return result
            time.sleep(pause)

    def result(self, job_id: int, *, conn: Connection | None = None) -> Any:
        """What a done job's handler returned (None for nothing). Raises JobNotFound
        (no such job, or removed by retention), ResultNotReady (queued or running)
        or JobFailed (failed or cancelled: its ``status`` and last ``error``).
        With ``conn``, read in your transaction (it sees a job enqueued there)."""
        return self._db.run(self._store.result(job_id), conn)

    def wait_result(
        self, job_id: int, *, timeout: float | None = None, poll_interval: float = 1.0
    ) -> Any:
        """Wait until the job finishes; then as :meth:`result`. TimeoutError after
        ``timeout`` seconds (None: no limit).

        Marks the job as waited for, so that its completion (or failure) sends a
        notification, heard on a connection of its own; a look every
        ``poll_interval`` seconds finds what no notification told (a cancel, a
        lost connection, a worker with ``notify=False``).
        """
        limit = None if timeout is None else validate.seconds(timeout, "timeout", 7 * 86400.0)
        interval = validate.seconds(poll_interval, "poll_interval", 3600.0, allow_zero=False)
        deadline = None if limit is None else monotonic() + limit
        with self._db.notified(self._store.listen_results()) as wait:
            marked = False
            while True:
                if not marked:  # listening already
                    marked = self._db.run(self._store.await_result(job_id))
                try:
                    return self.result(job_id)
                except ResultNotReady:
                    pass
                left = interval if deadline is None else deadline - monotonic()
                if left <= 0:
                    raise TimeoutError(f"job {job_id} did not finish within {limit:g}s")
                # Not marked (its row was held): its end may notify nothing, so
                # try the mark again soon rather than after a whole interval.
                wait(min(interval, left) if marked else min(MARK_RETRY_SECONDS, interval, left))

    def schedules(self) -> list[ScheduleInfo]:
        """Every periodic job the app's workers declared, with its bookkeeping."""
        return self._db.run(self._store.schedules())

    def remove_schedule(self, name: str, *, actor: str | None = None) -> bool:
        """Remove the schedule ``name`` with its bookkeeping (True if there was one):
        for a periodic job taken out of the app's code, whose row would otherwise
        stay (listed, never due). The jobs it enqueued stay. A worker still running
        with it declared no longer ticks it; one started with it declares it again,
        from its next tick. Audited under ``actor``."""
        return self._db.run(self._store.remove_schedule(name, actor=actor))

    def get(self, job_id: int, *, conn: Connection | None = None) -> Job:
        """The job as stored, or JobNotFound (which says so of a job retention
        moved to the archive). With ``conn``, read in your transaction: it sees a
        job enqueued there and not committed yet."""
        return self._db.run_steps(_steps.get(self._store, job_id), conn)

    def list_jobs(
        self, status: JobStatus | str, *, queue: str | None = None, limit: int = 100
    ) -> list[Job]:
        """Jobs of one status (and queue), newest first."""
        return self._db.run(self._store.list_jobs(status, queue=queue, limit=limit))

    def find_jobs(
        self,
        *,
        queue: str | None = None,
        status: JobStatus | str | None = None,
        key: str | None = None,
        error: str | None = None,
        payload: dict[str, Any] | None = None,
        before: int | None = None,
        limit: int = 50,
        window: int = 10_000,
        window_top: int | None = None,
    ) -> JobPage:
        """One page of the jobs matching every filter given, newest first: ``error``
        a case-insensitive substring of the last error, ``payload`` fields the
        payload contains (``{"customer": "acme"}``). Pass the page's
        ``next_before`` as ``before`` for the next. Only the newest ``window`` job
        ids are searched, so a search costs the same on any table (``window_end``
        tells when older jobs were left out); failed jobs (``status="failed"``),
        kept until replayed or their retention ends, are found however old: older ones through their
        index, the newest ``window`` failures of each queue. ``window_top``: the
        page's ``window_top`` with its ``next_before``, so that the next page searches
        the same window (jobs enqueued meanwhile would otherwise push older jobs of
        it, not shown yet, out of the next page's)."""
        operation = self._store.find_jobs(
            queue=queue,
            status=status,
            key=key,
            error=error,
            payload=payload,
            before=before,
            limit=limit,
            window=window,
            window_top=window_top,
        )
        return self._db.run(operation)

    def running_jobs(self, queue: str | None = None, *, limit: int = 100) -> list[Job]:
        """Running jobs, the lease that ends first first (expired leases, waiting for
        recovery, lead), each with its ``lease_remaining``; read through the running
        jobs' index, whatever the table's size."""
        return self._db.run(self._store.running_jobs(queue, limit=limit))

    def failed_groups(self, queue: str | None = None, *, limit: int = 50) -> FailedSummary:
        """Failed jobs grouped by queue and error text, largest group first (the
        newest 500 failed jobs of each queue are read: ``capped`` says when it has more)."""
        return self._db.run(self._store.failed_groups(queue, limit=limit))

    def blocked_keys(self, queue: str | None = None, *, limit: int = 100) -> list[BlockedKey]:
        """Ordering keys held by a failed head under the ``block`` policy, newest
        failure first: the head, its error, how many jobs wait behind it. Skip a
        head with ``cancel(head_job_id)`` or replay it."""
        return self._db.run(self._store.blocked_keys(queue, limit=limit))

    def activity(self, queue: str | None = None, *, minutes: int = 60) -> list[QueueActivity]:
        """Per queue: jobs done and failed per minute over the last ``minutes``, and
        the p50/p95/p99 of the done ones' durations (claim to finish)."""
        return self._db.run(self._store.activity(queue, minutes=minutes))

    def audit_log(
        self, *, queue: str | None = None, before: int | None = None, limit: int = 50
    ) -> list[AuditEntry]:
        """Operator actions (replay, cancel, configure, pause, resume), newest first;
        ``before`` an ``audit_id`` for the next page."""
        return self._db.run(self._store.audit_log(queue=queue, before=before, limit=limit))

    def queue_names(self) -> list[str]:
        """The schema's queues, sorted (every queue enqueued into or configured):
        the queues ``stats()`` lists, at a cost that does not grow with any job."""
        return self._db.run(self._store.queue_names())

    def stats(self, queue: str | None = None) -> list[QueueStats]:
        """Per queue: jobs by status, queued bytes, oldest ready age, expired leases, in
        one statement that reads no finished job: unfinished counts are exact, finished
        ones of a large table are estimates (each result's ``estimated`` names them)."""
        return self._db.run(self._store.stats(queue))

    def configure_queue(
        self, name: str, *, actor: str | None = None, **settings: Any
    ) -> QueueSettings:
        """Change a queue's settings (only those named); returns them all. Audited
        under ``actor`` (pausing and resuming as such)."""
        return self._db.run(self._store.configure_queue(name, actor=actor, **settings))

    def queue_settings(self, name: str) -> QueueSettings | None:
        """A queue's settings, or None if it was never used."""
        return self._db.run(self._store.queue_settings(name))

    # -- health -------------------------------------------------------------------

    def health(self, *, long_transaction: float = 60.0) -> Health:
        """The schema's tables and indexes (sizes, live and dead rows, last vacuum and
        analyze), what holds back their cleanup, whether autovacuum runs, and
        warnings in plain language; a transaction open for ``long_transaction``
        seconds that holds back cleanup is warned about; so is a schema that misses
        migrations this code needs (``Health.migrations_missing``)."""
        return self._db.run_steps(_steps.health(self._store, long_transaction=long_transaction))

    def explain_claim(self, queue: str) -> ClaimPlan:
        """The plan the server picks now for a claim of ``queue`` (EXPLAIN; the
        claim does not run), with a warning when it does not read the ready index."""
        return self._db.run(self._store.explain_claim(queue))
