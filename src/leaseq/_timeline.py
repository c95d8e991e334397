"""A job's life as the dashboard's Job page and ``leaseq job`` tell it: enqueued,
every run (claimed, renewed, how it ended, replays and cancels between them), and
where it is now.

The history (``Job.history``) holds an entry per ended run and per operator
action, each with the run's claim and last renewal; the run that is going on,
or that completed the job, is told by the job's own columns. Runs are numbered
over the job's whole life: a replay gives the job a fresh attempt budget (its
``attempts`` restart at 0), not a new past. The history keeps a job's newest
HISTORY_KEPT entries only: once older ones are gone, numbering starts after the
runs the oldest kept entry's own ``attempt`` counts before it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ._types import Job, JobStatus

#: Entries a job's history keeps, the newest (``history_append``, migration 0001).
HISTORY_KEPT = 50

#: How each history outcome reads; those that end a run are in ENDS_A_RUN.
OUTCOMES = {
    "retry": "failed, retried later",
    "failed": "failed",
    "lease_expired": "lease expired (worker lost), recovered by the next claim",
    "released": "released at worker shutdown (not counted as an attempt)",
    "replayed": "replayed",
    "cancelled": "cancelled",
    "exhausted": "no attempts left: failed",
}
ENDS_A_RUN = frozenset({"retry", "failed", "lease_expired", "released"})
#: A lease that expired on the job's last attempt: the reaper failed the job
#: (reap.sql) with the same history outcome as a lease the next claim recovered.
REAPED = "lease expired on its last attempt (worker lost): failed"


def blocked_by(job_id: int) -> str:
    """What a queued job that failed job ``job_id`` holds back waits for."""
    return f"blocked by failed job #{job_id} (replay or skip it)"


@dataclass(frozen=True, slots=True)
class Event:
    """One line of a job's timeline."""

    at: Any
    kind: str  # a CSS class: enqueued, claimed, renewed, retry, failed, lost, ...
    text: str
    error: str | None = None
    actor: str | None = None
    #: A path of the dashboard the line links to (the job that holds this one back).
    href: str | None = None


def timeline(job: Job) -> list[Event]:
    """The job's life, oldest first."""
    events = [Event(job.created_at, "enqueued", "enqueued")]
    reaped = _reaped_entry(job)
    runs = _runs_not_kept(job.history)
    if runs or len(job.history) >= HISTORY_KEPT:
        events.append(_not_kept(runs))
    for entry in job.history:
        if _ends_a_run(entry):
            runs += 1
            events += _run(runs, entry, job if entry is reaped else None)
        else:
            outcome = str(entry.get("outcome", ""))
            events.append(
                Event(
                    entry.get("at"),
                    outcome or "event",
                    OUTCOMES.get(outcome, outcome or "event"),
                    error=entry.get("error"),
                    actor=entry.get("actor"),
                )
            )
    return events + _now(job, runs)


def _runs_not_kept(history: tuple[dict[str, Any], ...]) -> int:
    """How many runs at least came before the oldest entry a full history kept.

    Its ``attempt`` is the job's attempts when it was written: the runs of its
    attempt budget so far (one of them its own, if it ended a run; a replay's, the
    whole budget it ended). Runs before an earlier replay, and runs given back at
    a worker's stop (not counted as attempts), are not counted: at least."""
    if len(history) < HISTORY_KEPT:
        return 0  # (nothing dropped: the first entry is the job's first)
    oldest = history[0]
    attempt = oldest.get("attempt")
    if isinstance(attempt, bool) or not isinstance(attempt, int):
        return 0
    return max(attempt - (1 if _ends_a_run(oldest) else 0), 0)


def _not_kept(runs: int) -> Event:
    kept = f"(a job's history keeps its newest {HISTORY_KEPT} entries)"
    if not runs:
        return Event(None, "not-kept", f"older entries, if any, were not kept {kept}")
    return Event(
        None, "not-kept", f"at least {runs} earlier run{'s' if runs > 1 else ''} not kept {kept}"
    )


def _ends_a_run(entry: dict[str, Any]) -> bool:
    outcome = entry.get("outcome")
    return outcome in ENDS_A_RUN or (
        outcome == "cancelled" and entry.get("previous_status") == "running"
    )


def _run(run: int, entry: dict[str, Any], reaped: Job | None) -> list[Event]:
    """A run that ended with ``entry``: its claim, last renewal and end; ``reaped``:
    the job the reaper failed with this entry (the end is that failure)."""
    events = _run_start(run, entry.get("claimed_at"), entry.get("lease_version"))
    if entry.get("renewed_at") and entry.get("renewed_at") != entry.get("claimed_at"):
        events.append(Event(entry["renewed_at"], "renewed", "lease last renewed"))
    outcome = str(entry.get("outcome", ""))
    kind, text, error = outcome, OUTCOMES.get(outcome, outcome), entry.get("error")
    if outcome == "cancelled":
        text = "cancelled while running: its claim ended through the lease fence"
    if reaped is not None:
        kind, text, error = "failed", REAPED, reaped.last_error
    events.append(
        Event(entry.get("at"), kind, f"run {run}: {text}", error=error, actor=entry.get("actor"))
    )
    return events


def _reaped_entry(job: Job) -> dict[str, Any] | None:
    """The history entry of the reaper's failure of ``job``, if that is how it failed:
    a failed job's last entry is its failure, and ``lease_expired`` there means the
    reaper's (a claim recovers an expired lease only while attempts are left)."""
    if job.status is not JobStatus.FAILED or not job.history:
        return None
    last = job.history[-1]
    return last if last.get("outcome") == "lease_expired" else None


def _run_start(run: int, claimed_at: Any, lease_version: Any) -> list[Event]:
    if not claimed_at:
        return []
    lease = f", lease version {lease_version}" if lease_version is not None else ""
    return [Event(claimed_at, "claimed", f"run {run} claimed{lease}")]


def _now(job: Job, runs: int) -> list[Event]:
    """Where the job is: the run going on or the one that completed it, or waiting."""
    status = job.status
    if status is JobStatus.RUNNING:
        return [
            Event(
                job.claimed_at,
                "running",
                f"run {runs + 1} running (attempt {job.attempts} of {job.max_attempts}), "
                f"lease version {job.lease_version}",
            )
        ]
    if status is JobStatus.DONE:
        return [
            *_run_start(runs + 1, job.claimed_at, job.lease_version),
            Event(job.finished_at, "done", f"run {runs + 1}: done"),
        ]
    if status is JobStatus.QUEUED:
        if job.blocked_by is not None:
            # No claim takes it until an operator acts; `ahead` counts unfinished
            # jobs only, not the failed one that holds the key.
            return [
                Event(
                    job.available_at,
                    "blocked",
                    f"queued: {blocked_by(job.blocked_by)}",
                    href=f"/jobs/{job.blocked_by}",
                )
            ]
        if job.ahead:
            waiting = f"queued behind {job.ahead} earlier job(s) of key {job.key!r}"
        else:
            waiting = "queued: claimable from here on"
        return [Event(job.available_at, "queued", waiting)]
    return []
