-- Complete a batch of claims, each fenced by (job_id, lease_version) and a
-- live lease. A claim whose completion already committed (the caller retries
-- after an ambiguous commit) is reported as accepted; every other miss is a
-- lost lease.
WITH claimed AS (
    SELECT *
    FROM unnest(%(job_ids)s::bigint[], %(lease_versions)s::bigint[])
        AS c (job_id, lease_version)
),
completed AS (
    UPDATE {schema}.job AS j
    SET status = 'done',
        lease_until = NULL,
        finished_at = {schema}.clock()
    FROM claimed AS c
    WHERE j.job_id = c.job_id
      AND j.lease_version = c.lease_version
      AND j.status = 'running'
      AND j.lease_until > {schema}.clock()
    RETURNING j.job_id
)
SELECT c.job_id,
       completed.job_id IS NOT NULL
           OR (j.status = 'done' AND j.lease_version = c.lease_version) AS accepted
FROM claimed AS c
LEFT JOIN completed ON completed.job_id = c.job_id
LEFT JOIN {schema}.job AS j ON j.job_id = c.job_id
