-- Give a batch of unfinished claims back at once (graceful shutdown), each
-- fenced by (job_id, lease_version) and a live lease. The interrupted attempt
-- is not counted: shutting workers down must not use up a job's budget.
WITH claimed AS (
    SELECT *
    FROM unnest(%(job_ids)s::bigint[], %(lease_versions)s::bigint[])
        AS c (job_id, lease_version)
),
released AS (
    UPDATE {schema}.job AS j
    SET status = 'queued',
        lease_until = NULL,
        available_at = {schema}.clock(),
        attempts = greatest(j.attempts - 1, 0),
        history = {schema}.history_append(j.history, jsonb_build_object(
            'attempt', j.attempts, 'at', {schema}.clock(), 'outcome', 'released'))
    FROM claimed AS c
    WHERE j.job_id = c.job_id
      AND j.lease_version = c.lease_version
      AND j.status = 'running'
      AND j.lease_until > {schema}.clock()
    RETURNING j.job_id
)
SELECT c.job_id, released.job_id IS NOT NULL AS accepted
FROM claimed AS c
LEFT JOIN released ON released.job_id = c.job_id
