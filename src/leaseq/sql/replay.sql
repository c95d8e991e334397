-- Put a failed or cancelled job back in its queue with a fresh attempt budget.
-- The job keeps its id (so its idempotency key still matches) and its history.
-- lease_version moves on (fencing tokens only grow): no write of a claim from
-- before the replay can be taken for one of the replayed job's.
-- Targets: one job (job_id), or every failed job of a queue (queue).
WITH target AS (
    SELECT j.job_id, j.status
    FROM {schema}.job AS j
    WHERE j.job_id = %(job_id)s::bigint
       OR (j.queue = %(queue)s::text AND j.status = 'failed')
),
replayed AS (
    UPDATE {schema}.job AS j
    SET status = 'queued',
        attempts = 0,
        lease_version = j.lease_version + 1,
        available_at = {schema}.clock(),
        finished_at = NULL,
        history = {schema}.history_append(j.history, jsonb_build_object(
            'attempt', j.attempts, 'at', {schema}.clock(), 'outcome', 'replayed',
            'previous_status', j.status))
    FROM target AS t
    WHERE j.job_id = t.job_id AND j.status IN ('failed', 'cancelled')
    RETURNING j.job_id
)
SELECT t.job_id, t.status, replayed.job_id IS NOT NULL AS changed
FROM target AS t LEFT JOIN replayed ON replayed.job_id = t.job_id
ORDER BY t.job_id
