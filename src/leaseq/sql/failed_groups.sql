-- Failed jobs grouped by queue and error text (its first 300 characters: the
-- same failure with a different detail at the end still groups), largest group
-- first. At most %(cap)s failed jobs are read, through the failed-jobs index;
-- the last column tells whether there were more (then counts are a floor).
WITH failed AS MATERIALIZED (
    SELECT j.job_id, j.queue, j.last_error, j.finished_at
    FROM {schema}.job AS j
    WHERE j.status = 'failed' AND (%(queue)s::text IS NULL OR j.queue = %(queue)s::text)
    LIMIT %(cap)s + 1
),
read AS (
    SELECT f.* FROM failed AS f ORDER BY f.job_id DESC LIMIT %(cap)s
)
SELECT r.queue, left(r.last_error, 300) AS error, count(*) AS jobs,
       max(r.job_id) AS newest_job_id, max(r.finished_at) AS newest_at,
       (SELECT count(*) FROM read) AS scanned,
       (SELECT count(*) FROM failed) > %(cap)s AS capped
FROM read AS r
GROUP BY r.queue, left(r.last_error, 300)
ORDER BY jobs DESC, newest_job_id DESC
LIMIT %(limit)s
