"""Turning result rows into the public dataclasses (no I/O)."""

from __future__ import annotations

from typing import Any

from ._types import (
    Claim,
    Job,
    JobStatus,
    OrderingPolicy,
    PruneResult,
    QueueSettings,
    QueueStats,
    RetentionMode,
)


def claim_from_row(schema: str, row: tuple[Any, ...]) -> Claim:
    (job_id, queue, payload, version, attempts, max_attempts, key, seq, until, lease, idem) = row[
        :11
    ]
    recovered, ready_at, claimed_at, trace_context, timeout, group = row[11:17]
    # Positional, in Claim's field order: the frozen dataclass's keyword form
    # costs a quarter more, and this runs once per job a worker claims.
    return Claim(
        job_id,
        queue,
        payload,
        version,
        attempts,
        max_attempts,
        key,
        seq,
        until,
        lease,
        idem or default_idempotency_key(schema, job_id),
        bool(recovered),
        ready_at,
        claimed_at,
        trace_context,
        timeout,
        group,
    )


def default_idempotency_key(schema: str, job_id: int) -> str:
    """A job's identity: stable across attempts and replays, unlike lease_version."""
    return f"{schema}:{job_id}"


def job_from_row(schema: str, row: tuple[Any, ...], *, blocked_by: int | None = None) -> Job:
    """A Job of a job row's first 24 columns (the statements' own columns follow);
    ``blocked_by`` is get()'s alone."""
    (
        job_id,
        queue,
        payload,
        payload_bytes,
        status,
        priority,
        available_at,
        lease_until,
        version,
        attempts,
        max_attempts,
        key,
        seq,
        idem,
        last_error,
        history,
        created_at,
        claimed_at,
        finished_at,
        lease_remaining,
        ahead,
        unique_key,
        timeout,
        group,
    ) = row[:24]
    return Job(
        job_id=job_id,
        queue=queue,
        payload=payload,
        payload_bytes=payload_bytes,
        status=JobStatus(status),
        priority=priority,
        available_at=available_at,
        lease_until=lease_until,
        lease_version=version,
        attempts=attempts,
        max_attempts=max_attempts,
        key=key,
        seq=seq,
        idempotency_key=idem or default_idempotency_key(schema, job_id),
        last_error=last_error,
        history=tuple(history),
        created_at=created_at,
        claimed_at=claimed_at,
        finished_at=finished_at,
        lease_remaining=lease_remaining,
        ahead=None if ahead is None else int(ahead),
        unique_key=unique_key,
        timeout=timeout,
        group=group,
        blocked_by=blocked_by,
    )


def settings_from_row(row: tuple[Any, ...]) -> QueueSettings:
    (
        name,
        lease,
        max_attempts,
        base,
        cap,
        policy,
        max_jobs,
        max_bytes,
        max_payload,
        paused,
        backlog_jobs,
        backlog_bytes,
        retain_done,
        retain_cancelled,
        retain_failed,
        retention_mode,
        retain_archived,
    ) = row[:17]
    max_running, per_group, rate, period, group_rate, group_period = row[17:23]
    return QueueSettings(
        name=name,
        lease=lease,
        max_attempts=max_attempts,
        backoff_base=base,
        backoff_cap=cap,
        ordering_policy=OrderingPolicy(policy),
        max_queued_jobs=max_jobs,
        max_queued_bytes=max_bytes,
        max_payload_bytes=max_payload,
        paused=paused,
        backlog_jobs=int(backlog_jobs),
        backlog_bytes=int(backlog_bytes),
        retain_done=retain_done,
        retain_cancelled=retain_cancelled,
        retain_failed=retain_failed,
        retention_mode=RetentionMode(retention_mode),
        retain_archived=retain_archived,
        max_running=max_running,
        max_running_per_group=per_group,
        rate_limit=None if rate is None else (rate, period),
        rate_limit_per_group=None if group_rate is None else (group_rate, group_period),
    )


def stats_from_row(row: tuple[Any, ...]) -> QueueStats:
    (name, queued, running, done, failed, cancelled, queued_bytes, age, expired, paused) = row[:10]
    counts = (queued, running, done, failed, cancelled)
    return QueueStats(
        queue=name,
        counts=dict(zip(JobStatus, counts, strict=True)),
        queued_bytes=queued_bytes,
        oldest_ready_age=age,
        expired_leases=expired,
        paused=paused,
        estimated=frozenset(JobStatus(s) for s in row[10]),
    )


def prune_from_rows(rows: list[tuple[Any, ...]], *, dry_run: bool, more: bool) -> PruneResult:
    """Rows of (action, queue, status, jobs), action 'deleted', 'archived' or 'expired'."""
    counts: dict[str, dict[tuple[str, JobStatus], int]] = {
        "deleted": {},
        "archived": {},
        "expired": {},
    }
    for action, queue, status, jobs in rows:
        key = (queue, JobStatus(status))
        counts[action][key] = counts[action].get(key, 0) + int(jobs)
    return PruneResult(**counts, dry_run=dry_run, more=more)
