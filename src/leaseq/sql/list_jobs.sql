-- Jobs by status and (optionally) queue, newest first; what operators page through.
-- Failed and running jobs are read through their own partial indexes
-- (job_failed_idx, job_lease_idx), every one of them, and the newest kept:
-- their number is the cost, not the table's. Read from the primary key's end
-- (`ORDER BY job_id` over the whole table, which the planner picks when it
-- takes them for evenly spread), old failures under a million newer finished
-- jobs walked every newer row (2.6 s). (`job_id + 0`: an order the primary key
-- cannot give.) Queued, done and cancelled jobs are read from the primary
-- key's end: the newest rows are mostly theirs, and their indexes are not in
-- job id order.
-- One branch runs: the others' one-time filter on %(status)s is false.
WITH picked AS (
    (SELECT j.job_id FROM {schema}.job AS j
     WHERE %(status)s::text = 'failed' AND j.status = 'failed'
       AND (%(queue)s::text IS NULL OR j.queue = %(queue)s::text)
     ORDER BY j.job_id + 0 DESC
     LIMIT %(limit)s)
    UNION ALL
    (SELECT j.job_id FROM {schema}.job AS j
     WHERE %(status)s::text = 'running' AND j.status = 'running'
       AND (%(queue)s::text IS NULL OR j.queue = %(queue)s::text)
     ORDER BY j.job_id + 0 DESC
     LIMIT %(limit)s)
    UNION ALL
    (SELECT j.job_id FROM {schema}.job AS j
     WHERE %(status)s::text NOT IN ('failed', 'running') AND j.status = %(status)s::text
       AND (%(queue)s::text IS NULL OR j.queue = %(queue)s::text)
     ORDER BY j.job_id DESC
     LIMIT %(limit)s)
)
SELECT j.job_id, j.queue, j.payload, j.payload_bytes, j.status, j.priority, j.available_at,
       j.lease_until, j.lease_version, j.attempts, j.max_attempts, j.ordering_key,
       j.ordering_seq, j.idempotency_key, j.last_error, j.history, j.created_at,
       j.claimed_at, j.finished_at,
       CASE WHEN j.status = 'running'
            THEN extract(epoch FROM j.lease_until - {schema}.clock())::double precision END,
       NULL::bigint, j.unique_key, j.timeout_seconds, j.group_key
FROM picked AS p
JOIN {schema}.job AS j ON j.job_id = p.job_id
ORDER BY j.job_id DESC
