-- Cancel a queued job, or skip a failed one (which unblocks its ordering key).
-- Running jobs are not touched: their owner holds the lease.
WITH target AS (
    SELECT j.job_id, j.status FROM {schema}.job AS j WHERE j.job_id = %(job_id)s
),
cancelled AS (
    UPDATE {schema}.job AS j
    SET status = 'cancelled',
        finished_at = {schema}.clock(),
        history = {schema}.history_append(j.history, jsonb_build_object(
            'attempt', j.attempts, 'at', {schema}.clock(), 'outcome', 'cancelled',
            'previous_status', j.status))
    FROM target AS t
    WHERE j.job_id = t.job_id AND j.status IN ('queued', 'failed')
    RETURNING j.job_id
)
SELECT t.job_id, t.status, cancelled.job_id IS NOT NULL AS changed
FROM target AS t LEFT JOIN cancelled ON cancelled.job_id = t.job_id
