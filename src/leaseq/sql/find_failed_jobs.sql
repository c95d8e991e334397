-- find_jobs of failed jobs: one page of those matching the filters, newest first,
-- after the keyset %(before)s. Failed jobs stay until replayed, however many newer
-- jobs of any queue came since (the Failed page counts them; a group's replay must
-- find them), so this search is not bounded by the window of job ids alone:
-- * `recent`: the failed jobs among the newest %(window)s job ids, read as
--   find_jobs.sql reads them (a backward range of the primary key);
-- * `past`, only when those do not fill the page: older failures, through their
--   index. Per queue, the newest %(window)s of them (a backward range of
--   job_failed_idx (queue, finished_at, job_id), read from the index alone, as
--   failed_groups.sql reads them) are candidates, read by primary key newest id
--   first until the page is full.
-- The cost is the window per queue, whatever the table holds. Always one row at
-- least (NULL job columns when nothing matched) carrying whether a queue had
-- more old failures than the window (left unsearched).
-- The window hangs from the newest job id, or from %(top)s (a later page's: the
-- first page's top), as in find_jobs.sql.
WITH edge AS (
    SELECT t.top, t.top - %(window)s AS floor
    FROM (SELECT least(coalesce(max(j.job_id), 0), %(top)s::bigint) AS top
          FROM {schema}.job AS j) AS t
),
queues AS (
    SELECT q.name FROM {schema}.queue AS q
    WHERE %(queue)s::text IS NULL OR q.name = %(queue)s::text
),
older AS MATERIALIZED (
    SELECT f.job_id, f.position
    FROM edge
    CROSS JOIN queues AS qs
    CROSS JOIN LATERAL (
        SELECT j.job_id,
               row_number() OVER (ORDER BY j.finished_at DESC, j.job_id DESC) AS position
        FROM {schema}.job AS j
        -- (`+ 0`: a filter, never a range of the primary key, which the planner
        -- took on some statistics and then sorted the table's older rows)
        WHERE j.queue = qs.name AND j.status = 'failed' AND j.job_id + 0 <= edge.floor
        ORDER BY j.finished_at DESC, j.job_id DESC
        LIMIT %(window)s + 1
    ) AS f
),
recent AS MATERIALIZED (
    SELECT j.job_id, j.queue, j.payload, j.payload_bytes, j.status, j.priority, j.available_at,
           j.lease_until, j.lease_version, j.attempts, j.max_attempts, j.ordering_key,
           j.ordering_seq, j.idempotency_key, j.last_error, j.history, j.created_at,
           j.claimed_at, j.finished_at, j.unique_key, j.timeout_seconds, j.group_key
    FROM {schema}.job AS j
    -- (a subquery: the floor is then an index condition of the primary key's range)
    WHERE j.job_id > (SELECT edge.floor FROM edge) AND j.job_id <= (SELECT edge.top FROM edge)
      AND (%(before)s::bigint IS NULL OR j.job_id < %(before)s::bigint)
      AND j.status = 'failed'
      AND (%(queue)s::text IS NULL OR j.queue = %(queue)s::text)
      AND (%(key)s::text IS NULL OR j.ordering_key = %(key)s::text)
      AND (%(error)s::text IS NULL OR strpos(lower(j.last_error), lower(%(error)s::text)) > 0)
      AND (%(payload)s::jsonb IS NULL OR j.payload @> %(payload)s::jsonb)
    ORDER BY j.job_id DESC
    LIMIT %(limit)s + 1
),
past AS (
    SELECT j.job_id, j.queue, j.payload, j.payload_bytes, j.status, j.priority, j.available_at,
           j.lease_until, j.lease_version, j.attempts, j.max_attempts, j.ordering_key,
           j.ordering_seq, j.idempotency_key, j.last_error, j.history, j.created_at,
           j.claimed_at, j.finished_at, j.unique_key, j.timeout_seconds, j.group_key
    FROM (
        SELECT o.job_id FROM older AS o
        WHERE o.position <= %(window)s
          AND (%(before)s::bigint IS NULL OR o.job_id < %(before)s::bigint)
        ORDER BY o.job_id DESC
    ) AS c
    -- Row by row in the candidates' order, so the page stops reading once full:
    -- the LIMIT 1 keeps the planner from joining the candidates to a scan of the
    -- whole table (it did, by merge join on job_pkey, misjudging their number).
    CROSS JOIN LATERAL (
        SELECT * FROM {schema}.job AS r WHERE r.job_id = c.job_id LIMIT 1
    ) AS j
    WHERE j.status = 'failed'
      AND (%(key)s::text IS NULL OR j.ordering_key = %(key)s::text)
      AND (%(error)s::text IS NULL OR strpos(lower(j.last_error), lower(%(error)s::text)) > 0)
      AND (%(payload)s::jsonb IS NULL OR j.payload @> %(payload)s::jsonb)
    ORDER BY c.job_id DESC
    -- Nothing read (LIMIT 0) when the recent failures fill the page.
    LIMIT %(limit)s + 1 - (SELECT count(*) FROM recent)
),
capped AS (
    SELECT EXISTS (SELECT 1 FROM older AS o WHERE o.position > %(window)s) AS capped
)
SELECT found.*, capped.capped, (SELECT edge.top FROM edge)
FROM capped
LEFT JOIN LATERAL (
    SELECT f.job_id, f.queue, f.payload, f.payload_bytes, f.status, f.priority, f.available_at,
           f.lease_until, f.lease_version, f.attempts, f.max_attempts, f.ordering_key,
           f.ordering_seq, f.idempotency_key, f.last_error, f.history, f.created_at,
           f.claimed_at, f.finished_at, NULL::double precision AS lease_remaining,
           NULL::bigint AS ahead, f.unique_key, f.timeout_seconds, f.group_key
    FROM (SELECT * FROM recent UNION ALL SELECT * FROM past) AS f
) AS found ON true
ORDER BY found.job_id DESC
