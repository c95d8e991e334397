-- Give a batch of claims back for another attempt, each fenced by
-- (job_id, lease_version) and a live lease. A NULL delay takes the queue's
-- backoff; a job with no attempts left goes to 'failed' instead. A retry that
-- already committed (same lease_version, back in 'queued') is accepted again.
WITH claimed AS (
    SELECT *
    FROM unnest(%(job_ids)s::bigint[], %(lease_versions)s::bigint[],
                %(delays)s::double precision[], %(errors)s::text[])
        AS c (job_id, lease_version, delay, error)
),
retried AS (
    UPDATE {schema}.job AS j
    SET status = CASE WHEN j.attempts >= j.max_attempts THEN 'failed' ELSE 'queued' END,
        available_at = CASE WHEN j.attempts >= j.max_attempts THEN j.available_at
            ELSE {schema}.clock() + make_interval(secs => coalesce(
                c.delay,
                {schema}.backoff_seconds(j.attempts, q.backoff_base_seconds, q.backoff_cap_seconds)))
            END,
        lease_until = NULL,
        finished_at = CASE WHEN j.attempts >= j.max_attempts THEN {schema}.clock() END,
        last_error = coalesce(c.error, j.last_error),
        history = {schema}.history_append(j.history, jsonb_build_object(
            'attempt', j.attempts, 'at', {schema}.clock(), 'error', c.error,
            'outcome', CASE WHEN j.attempts >= j.max_attempts THEN 'failed' ELSE 'retry' END))
    FROM claimed AS c, {schema}.queue AS q
    WHERE j.job_id = c.job_id
      AND q.name = j.queue
      AND j.lease_version = c.lease_version
      AND j.status = 'running'
      AND j.lease_until > {schema}.clock()
    RETURNING j.job_id, j.status
)
SELECT c.job_id,
       coalesce(retried.status,
                CASE WHEN j.status = 'queued' AND j.lease_version = c.lease_version
                     THEN j.status END) AS status
FROM claimed AS c
LEFT JOIN retried ON retried.job_id = c.job_id
LEFT JOIN {schema}.job AS j ON j.job_id = c.job_id
