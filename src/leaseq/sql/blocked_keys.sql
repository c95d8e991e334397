-- Ordering keys held by a failed head under the `block` policy (the default of
-- a queue without settings): the key's earliest failed job, its error, its
-- lease_version (as read: an action on the head can ask that it is still that
-- one), and how many unfinished jobs of the key wait behind it (counted up to
-- %(waiting_cap)s, through job_ordering_idx). The heads come from
-- job_failed_key_idx in key order, the first %(cap)s keys at most, so the cost
-- is bounded on any table.
WITH heads AS (
    SELECT DISTINCT ON (f.queue, f.ordering_key)
           f.queue, f.ordering_key, f.ordering_seq, f.job_id, f.last_error, f.finished_at,
           f.lease_version
    FROM {schema}.job AS f
    LEFT JOIN {schema}.queue AS q ON q.name = f.queue
    WHERE f.status = 'failed' AND f.ordering_key IS NOT NULL
      AND (%(queue)s::text IS NULL OR f.queue = %(queue)s::text)
      AND coalesce(q.ordering_policy = 'block', true)
    ORDER BY f.queue, f.ordering_key, f.ordering_seq, f.job_id
    LIMIT %(cap)s
),
page AS (
    SELECT h.* FROM heads AS h ORDER BY h.finished_at DESC NULLS LAST, h.job_id DESC
    LIMIT %(limit)s
)
SELECT p.queue, p.ordering_key, p.job_id, p.last_error, p.finished_at, w.waiting,
       p.lease_version
FROM page AS p
CROSS JOIN LATERAL (
    SELECT count(*) AS waiting FROM (
        SELECT 1 FROM {schema}.job AS o
        WHERE o.queue = p.queue AND o.ordering_key = p.ordering_key
          AND o.status IN ('queued', 'running')
          AND (o.ordering_seq, o.job_id) > (p.ordering_seq, p.job_id)
        LIMIT %(waiting_cap)s + 1) AS behind
) AS w
ORDER BY p.finished_at DESC NULLS LAST, p.job_id DESC
