-- Fail a batch of claims for good, each fenced by (job_id, lease_version) and
-- a live lease. Lost leases come back with accepted = false.
WITH claimed AS (
    SELECT *
    FROM unnest(%(job_ids)s::bigint[], %(lease_versions)s::bigint[], %(errors)s::text[])
        AS c (job_id, lease_version, error)
),
failed AS (
    UPDATE {schema}.job AS j
    SET status = 'failed',
        lease_until = NULL,
        finished_at = {schema}.clock(),
        last_error = c.error,
        history = {schema}.history_append(j.history, jsonb_build_object(
            'attempt', j.attempts, 'at', {schema}.clock(), 'error', c.error,
            'outcome', 'failed'))
    FROM claimed AS c
    WHERE j.job_id = c.job_id
      AND j.lease_version = c.lease_version
      AND j.status = 'running'
      AND j.lease_until > {schema}.clock()
    RETURNING j.job_id
)
SELECT c.job_id, failed.job_id IS NOT NULL AS accepted
FROM claimed AS c
LEFT JOIN failed ON failed.job_id = c.job_id
