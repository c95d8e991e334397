-- Complete a batch of claims, each fenced by (job_id, lease_version) and a
-- live lease. A claim whose completion already committed (the caller resends
-- after an ambiguous commit) matches too and changes nothing, so it is
-- reported as accepted; every other miss is a lost lease. The duplicate is
-- matched by the UPDATE itself, not by a separate read: if the first
-- completion is still committing, the UPDATE waits for its row lock and then
-- re-checks the newest row version, which a read of the statement's snapshot
-- would not see.
WITH claimed AS (
    SELECT *
    FROM unnest(%(job_ids)s::bigint[], %(lease_versions)s::bigint[])
        AS c (job_id, lease_version)
),
completed AS (
    UPDATE {schema}.job AS j
    SET status = 'done',
        lease_until = NULL,
        finished_at = CASE WHEN j.status = 'done' THEN j.finished_at ELSE {schema}.clock() END
    FROM claimed AS c
    WHERE j.job_id = c.job_id
      AND j.lease_version = c.lease_version
      AND ((j.status = 'running' AND j.lease_until > {schema}.clock())
           -- Only a completion sets 'done', and only this claim had this version.
           OR j.status = 'done')
    RETURNING j.job_id
)
SELECT c.job_id, completed.job_id IS NOT NULL AS accepted
FROM claimed AS c
LEFT JOIN completed ON completed.job_id = c.job_id
