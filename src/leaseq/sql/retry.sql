-- Give a batch of claims back for another attempt, each fenced by
-- (job_id, lease_version) and a live lease. A NULL delay takes the queue's
-- backoff; a job with no attempts left goes to 'failed' instead.
-- A retry that already committed (same lease_version, back in 'queued', its
-- last history entry a retry) matches too and changes nothing, so a
-- resend after an ambiguous commit is accepted, even while the first retry is
-- still committing (the UPDATE re-checks the row after waiting for its lock).
WITH claimed AS (
    SELECT *
    FROM unnest(%(job_ids)s::bigint[], %(lease_versions)s::bigint[],
                %(delays)s::double precision[], %(errors)s::text[])
        AS c (job_id, lease_version, delay, error)
),
retried AS (
    UPDATE {schema}.job AS j
    SET status = CASE WHEN j.status = 'queued' THEN 'queued'
                      WHEN j.attempts >= j.max_attempts THEN 'failed'
                      ELSE 'queued' END,
        available_at = CASE WHEN j.status = 'queued' OR j.attempts >= j.max_attempts
            THEN j.available_at
            ELSE {schema}.clock() + make_interval(secs => coalesce(
                c.delay,
                {schema}.backoff_seconds(j.attempts, q.backoff_base_seconds, q.backoff_cap_seconds)))
            END,
        lease_until = NULL,
        finished_at = CASE WHEN j.status = 'running' AND j.attempts >= j.max_attempts
            THEN {schema}.clock() END,
        last_error = CASE WHEN j.status = 'queued' THEN j.last_error
            ELSE coalesce(c.error, j.last_error) END,
        history = CASE WHEN j.status = 'queued' THEN j.history
            ELSE {schema}.history_append(j.history, jsonb_build_object(
                'attempt', j.attempts, 'at', {schema}.clock(), 'error', c.error,
                'outcome', CASE WHEN j.attempts >= j.max_attempts THEN 'failed' ELSE 'retry' END))
            END
    FROM claimed AS c, {schema}.queue AS q
    WHERE j.job_id = c.job_id
      AND q.name = j.queue
      AND j.lease_version = c.lease_version
      AND ((j.status = 'running' AND j.lease_until > {schema}.clock())
           -- This claim's own retry, already committed; not a release, which
           -- also leaves the job queued under the same version.
           OR (j.status = 'queued' AND j.history -> -1 ->> 'outcome' = 'retry'))
    RETURNING j.job_id, j.status
)
SELECT c.job_id, retried.status
FROM claimed AS c
LEFT JOIN retried ON retried.job_id = c.job_id
