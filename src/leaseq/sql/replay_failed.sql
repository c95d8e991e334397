-- Replay every failed job of one queue (an operator's "retry all" after a fix).
UPDATE {schema}.job AS j
SET status = 'queued',
    attempts = 0,
    lease_version = j.lease_version + 1,
    available_at = {schema}.clock(),
    finished_at = NULL,
    history = {schema}.history_append(j.history, jsonb_build_object(
        'attempt', j.attempts, 'at', {schema}.clock(), 'outcome', 'replayed',
        'previous_status', j.status))
WHERE j.queue = %(queue)s AND j.status = 'failed'
RETURNING j.job_id
