-- A job's status, result and last error, from the job table or, once retention
-- moved it there, from the archive (results follow the job's retention).
SELECT r.status, r.result, r.last_error
FROM (
    SELECT j.status, j.result, j.last_error, 0 AS source
    FROM {schema}.job AS j WHERE j.job_id = %(job_id)s
    UNION ALL
    SELECT a.status, a.result, a.last_error, 1 AS source
    FROM {schema}.job_archive AS a WHERE a.job_id = %(job_id)s
) AS r
ORDER BY r.source
LIMIT 1
