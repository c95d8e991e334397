-- Per queue: jobs by status, queued bytes, the age of the oldest ready job and
-- running jobs whose lease has expired. A monitoring query (it scans the
-- table), not something for the hot path.
WITH per_queue AS (
    SELECT j.queue,
           count(*) FILTER (WHERE j.status = 'queued') AS queued,
           count(*) FILTER (WHERE j.status = 'running') AS running,
           count(*) FILTER (WHERE j.status = 'done') AS done,
           count(*) FILTER (WHERE j.status = 'failed') AS failed,
           count(*) FILTER (WHERE j.status = 'cancelled') AS cancelled,
           coalesce(sum(j.payload_bytes) FILTER (WHERE j.status = 'queued'), 0) AS queued_bytes,
           min(j.available_at) FILTER (
               WHERE j.status = 'queued' AND j.available_at <= {schema}.clock()
           ) AS oldest_ready_at,
           count(*) FILTER (
               WHERE j.status = 'running' AND j.lease_until <= {schema}.clock()
           ) AS expired_leases
    FROM {schema}.job AS j
    WHERE %(queue)s::text IS NULL OR j.queue = %(queue)s::text
    GROUP BY j.queue
)
SELECT q.name,
       coalesce(p.queued, 0), coalesce(p.running, 0), coalesce(p.done, 0),
       coalesce(p.failed, 0), coalesce(p.cancelled, 0), coalesce(p.queued_bytes, 0),
       extract(epoch FROM {schema}.clock() - p.oldest_ready_at)::double precision,
       coalesce(p.expired_leases, 0),
       q.paused
FROM {schema}.queue AS q
LEFT JOIN per_queue AS p ON p.queue = q.name
WHERE %(queue)s::text IS NULL OR q.name = %(queue)s::text
ORDER BY q.name
