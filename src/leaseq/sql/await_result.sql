-- wait_result is about to wait for this job: its completion or failure will
-- name it on the results channel (see complete.sql). Nothing for a finished job.
UPDATE {schema}.job AS j
SET result_awaited = true
WHERE j.job_id = %(job_id)s AND j.status IN ('queued', 'running') AND NOT j.result_awaited
