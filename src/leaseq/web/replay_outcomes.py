"""Why a replay left a job as it was, as the replay actions say it.

The library's bulk replay returns the ids it replayed; the others are read again
here to tell the operator why each stayed (changed meanwhile, a unique key held
by another job, a payload larger than its queue takes now), so that nobody looks
for a change that never happened, or waits for room that can never come."""

from __future__ import annotations

import leaseq

#: The jobs a bulk replay left alone that are read again to say why (one read each).
WHY_LEFT_READS = 100


def changed(job_id: int, job: leaseq.Job, undone: str) -> str:
    """The refusal of an action on a job whose lease_version moved on since the page."""
    return (
        f"Job {job_id} changed meanwhile: replayed since the page was shown, it is "
        f"{job.status.value} now (lease version {job.lease_version}). {undone}; look at it again."
    )


def too_large(job: leaseq.Job, settings: leaseq.QueueSettings | None) -> str | None:
    """Why ``job`` can never be replayed into its queue as it is set now, or None: its
    payload is over a limit lowered since it was enqueued (the one the library
    names, in the order it checks them: enqueued now, it would be refused)."""
    if settings is None:
        return None
    for name, limit in (
        ("max_payload_bytes", settings.max_payload_bytes),
        ("max_queued_bytes", settings.max_queued_bytes),
    ):
        if limit is not None and job.payload_bytes > limit:
            return (
                f"its payload of {job.payload_bytes:,} bytes is larger than its queue's "
                f"{name} of {limit:,} bytes now, so it can never fit (raise the limit to "
                "replay it)"
            )
    return None


async def not_replayed(
    client: leaseq.AsyncQueue, job_id: int, only_failed: bool, shown: int | None
) -> str:
    """Why a replay of ``job_id`` changed nothing, from the job as it is now."""
    job = await client.get(job_id)
    replayable = {leaseq.JobStatus.FAILED} | (
        set() if only_failed else {leaseq.JobStatus.CANCELLED}
    )
    if only_failed and job.status is leaseq.JobStatus.CANCELLED:
        return f"Job {job_id} was cancelled (skipped) meanwhile: not replayed."
    if shown is not None and job.lease_version != shown:
        return changed(job_id, job, "Not replayed")
    if job.status in replayable:
        why = too_large(job, await client.queue_settings(job.queue))
        if why is not None:
            return f"Job {job_id} not replayed: {why}."
        return f"Job {job_id} not replayed: another job of its queue holds its unique key."
    if job.status is leaseq.JobStatus.RUNNING:
        return (
            f"Job {job_id} is running: retrying it now would start a second run beside "
            "the first. Cancel it (its claim ends through the lease fence), then replay it."
        )
    return f"Job {job_id} is {job.status.value}: only failed or cancelled jobs replay."


async def left_alone(
    client: leaseq.AsyncQueue, left: list[int], ids: list[int], versions: list[int] | None
) -> str:
    """Why a bulk replay left ``left`` alone, as the tail of its message. A job
    still failed as shown was not replayed because its payload is larger than its
    queue takes now, or else because another job of its queue holds its unique
    key (a queue without room raises BacklogFull instead); the others changed
    meanwhile (replayed, skipped, run again)."""
    if not left:
        return ""
    if len(left) > WHY_LEFT_READS:
        return (
            f" ({len(left):,} were left alone: changed meanwhile, another job of their "
            "queue holds their unique key, or their payload is larger than their queue's "
            "limits now)"
        )
    shown = dict(zip(ids, versions, strict=True)) if versions is not None else {}
    settings: dict[str, leaseq.QueueSettings | None] = {}
    held = large = 0
    for job_id in left:
        try:
            job = await client.get(job_id)
        except leaseq.JobNotFound:
            continue  # (removed meanwhile: changed)
        if job.status is not leaseq.JobStatus.FAILED or shown.get(job_id, job.lease_version) != (
            job.lease_version
        ):
            continue
        if job.queue not in settings:
            settings[job.queue] = await client.queue_settings(job.queue)
        if too_large(job, settings[job.queue]) is None:
            held += 1
        else:
            large += 1
    parts = []
    if len(left) > held + large:
        parts.append(f"{len(left) - held - large:,} had changed meanwhile and were left alone")
    if held:
        parts.append(f"{held:,} not replayed: another job of their queue holds their unique key")
    if large:
        parts.append(
            f"{large:,} not replayed: their payload is larger than their queue's limits now "
            "(max_payload_bytes, max_queued_bytes), so they can never fit"
        )
    return f" ({'; '.join(parts)})"
