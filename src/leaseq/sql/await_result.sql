-- wait_result is about to wait for this job: its completion or failure will
-- name it on the results channel (see complete.sql). Nothing for a finished job.
-- A row another transaction holds (a handler completing in its own transaction)
-- is skipped, not waited for: the wait must keep its timeout. The answer says
-- whether the mark is in place or not needed; false: try again later.
WITH target AS (
    SELECT j.job_id
    FROM {schema}.job AS j
    WHERE j.job_id = %(job_id)s AND j.status IN ('queued', 'running') AND NOT j.result_awaited
    FOR UPDATE SKIP LOCKED
), marked AS (
    UPDATE {schema}.job AS j
    SET result_awaited = true
    FROM target
    WHERE j.job_id = target.job_id
    RETURNING j.job_id
)
SELECT EXISTS (SELECT 1 FROM marked)
       OR NOT EXISTS (SELECT 1 FROM {schema}.job AS j
                      WHERE j.job_id = %(job_id)s AND j.status IN ('queued', 'running')
                        AND NOT j.result_awaited)
