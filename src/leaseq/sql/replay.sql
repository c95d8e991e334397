-- Put failed or cancelled jobs back in their queue with a fresh attempt budget.
-- A job keeps its id (so its idempotency key still matches) and its history.
-- lease_version moves on (fencing tokens only grow): no write of a claim from
-- before the replay can be taken for one of the replayed job's.
-- Targets: the jobs of %(job_ids)s, or a batch of up to %(limit)s failed jobs
-- of a queue (queue), oldest failure first; the caller repeats until none is left.
-- Admission: a queue with limits takes back only what fits in its backlog
-- (jobs and bytes, as admit() counts them); the rest is reported `refused`
-- and left as it is. The UPDATE re-checks each row's status after locking it,
-- so concurrent replays never replay a job twice.
-- A job cancelled while running becomes claimable only once the lease that
-- the cancel cut short would have ended (its history entry keeps that end):
-- by then its old handler has been told, so the replay never starts a second
-- run beside a first one that has not noticed yet.
-- One audit row per queue holds the replayed ids (none if nothing changed).
WITH candidates AS (
    SELECT j.job_id, j.queue, j.status, j.payload_bytes, j.finished_at
    FROM {schema}.job AS j
    WHERE j.job_id = ANY(%(job_ids)s::bigint[])
       OR (j.queue = %(queue)s::text AND j.status = 'failed')
    ORDER BY j.finished_at, j.job_id
    LIMIT %(limit)s
),
room AS (
    SELECT q.name,
           q.max_queued_jobs
               - (SELECT coalesce(sum(b.jobs), 0) FROM {schema}.backlog AS b WHERE b.queue = q.name)
               AS jobs,
           q.max_queued_bytes
               - (SELECT coalesce(sum(b.bytes), 0) FROM {schema}.backlog AS b WHERE b.queue = q.name)
               AS bytes
    FROM {schema}.queue AS q
    WHERE q.name IN (SELECT c.queue FROM candidates AS c) AND q.counts_backlog
),
ranked AS (
    SELECT c.job_id, c.queue,
           row_number() OVER w AS position,
           sum(c.payload_bytes) OVER w AS bytes
    FROM candidates AS c
    WHERE c.status IN ('failed', 'cancelled')
    WINDOW w AS (PARTITION BY c.queue ORDER BY c.finished_at, c.job_id)
),
admitted AS (
    SELECT r.job_id
    FROM ranked AS r LEFT JOIN room ON room.name = r.queue
    WHERE (room.jobs IS NULL OR r.position <= room.jobs)
      AND (room.bytes IS NULL OR r.bytes <= room.bytes)
),
replayed AS (
    UPDATE {schema}.job AS j
    SET status = 'queued',
        attempts = 0,
        lease_version = j.lease_version + 1,
        available_at = greatest({schema}.clock(),
                                (j.history -> -1 ->> 'cut_lease_until')::timestamptz),
        finished_at = NULL,
        -- Counted in the backlog from now on if its queue counts (the trigger
        -- job_backlog_count adds it).
        counted = j.counted OR EXISTS (SELECT 1 FROM room WHERE room.name = j.queue),
        history = {schema}.history_append(j.history, jsonb_build_object(
            'attempt', j.attempts, 'at', {schema}.clock(), 'outcome', 'replayed',
            'previous_status', j.status,
            'actor', coalesce(%(actor)s::text, session_user::text)))
    FROM admitted AS a
    WHERE j.job_id = a.job_id AND j.status IN ('failed', 'cancelled')
    RETURNING j.job_id, j.queue
),
audit AS (
    INSERT INTO {schema}.audit (at, actor, action, queue, job_ids)
    SELECT {schema}.clock(), coalesce(%(actor)s::text, session_user::text), 'replay', r.queue,
           array_agg(r.job_id ORDER BY r.job_id)
    FROM replayed AS r
    GROUP BY r.queue
)
SELECT c.job_id, c.status,
       replayed.job_id IS NOT NULL AS changed,
       c.status IN ('failed', 'cancelled') AND admitted.job_id IS NULL AS refused
FROM candidates AS c
LEFT JOIN replayed ON replayed.job_id = c.job_id
LEFT JOIN admitted ON admitted.job_id = c.job_id
ORDER BY c.job_id
