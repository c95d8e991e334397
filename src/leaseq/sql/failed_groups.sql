-- Failed jobs grouped by queue and error text (its first 300 characters: the
-- same failure with a different detail at the end still groups; an empty text
-- is none, NULL: both read "no error text"), largest group first. Per queue only its newest %(cap)s failed jobs are read (a backward
-- range of job_failed_idx (queue, finished_at, job_id) each), so the cost is
-- bounded on any table; `capped` tells that a queue had more (then its counts
-- describe its newest failures, which is what an operator looks for first).
WITH queues AS (
    SELECT q.name FROM {schema}.queue AS q
    WHERE %(queue)s::text IS NULL OR q.name = %(queue)s::text
),
newest AS MATERIALIZED (
    SELECT qs.name AS queue, f.job_id, f.last_error, f.finished_at, f.position
    FROM queues AS qs
    CROSS JOIN LATERAL (
        SELECT j.job_id, j.last_error, j.finished_at,
               row_number() OVER (ORDER BY j.finished_at DESC, j.job_id DESC) AS position
        FROM {schema}.job AS j
        WHERE j.queue = qs.name AND j.status = 'failed'
        ORDER BY j.finished_at DESC, j.job_id DESC
        LIMIT %(cap)s + 1
    ) AS f
),
read AS (
    SELECT n.* FROM newest AS n WHERE n.position <= %(cap)s
)
SELECT r.queue, nullif(left(r.last_error, 300), '') AS error, count(*) AS jobs,
       max(r.job_id) AS newest_job_id, max(r.finished_at) AS newest_at,
       (SELECT count(*) FROM read) AS scanned,
       EXISTS (SELECT 1 FROM newest AS n WHERE n.position > %(cap)s) AS capped
FROM read AS r
GROUP BY r.queue, nullif(left(r.last_error, 300), '')
ORDER BY jobs DESC, newest_job_id DESC
LIMIT %(limit)s
