-- Per queue: jobs done and failed per minute over the last %(minutes)s minutes
-- (by the schema's clock, every minute present, oldest first) and the
-- p50/p95/p99 durations (claim to finish, seconds) of its newest
-- %(sample)s done jobs in that time.
-- The counts read only finished_at, so each queue and state is one range of
-- job_finished_idx (queue, status, finished_at, job_id) that an index-only scan
-- serves without visiting the table (pages vacuum marked all-visible); the
-- newest %(cap)s entries of each are read at most, and the last column tells
-- when a range had more (a busy queue: the counts are a floor). The durations
-- need the rows themselves: the newest %(sample)s done jobs only.
WITH span AS (
    SELECT date_trunc('minute', {schema}.clock()) AS now_minute,
           date_trunc('minute', {schema}.clock())
               - (%(minutes)s - 1) * interval '1 minute' AS since
),
queues AS (
    SELECT q.name FROM {schema}.queue AS q
    WHERE %(queue)s::text IS NULL OR q.name = %(queue)s::text
),
recent AS MATERIALIZED (
    SELECT qs.name AS queue, s.status, r.finished_at, r.position
    FROM queues AS qs
    CROSS JOIN (VALUES ('done'), ('failed')) AS s (status)
    CROSS JOIN LATERAL (
        SELECT j.finished_at,
               row_number() OVER (ORDER BY j.finished_at DESC) AS position
        FROM {schema}.job AS j
        WHERE j.queue = qs.name AND j.status = s.status
          AND j.finished_at >= (SELECT since FROM span)
        ORDER BY j.finished_at DESC
        LIMIT %(cap)s + 1
    ) AS r
),
counted AS (
    SELECT r.queue, date_trunc('minute', r.finished_at) AS start,
           count(*) FILTER (WHERE r.status = 'done') AS done,
           count(*) FILTER (WHERE r.status = 'failed') AS failed
    FROM recent AS r
    WHERE r.position <= %(cap)s
    GROUP BY 1, 2
),
durations AS (
    SELECT qs.name AS queue,
           percentile_cont(ARRAY[0.5, 0.95, 0.99]) WITHIN GROUP (ORDER BY d.seconds) AS p
    FROM queues AS qs
    CROSS JOIN LATERAL (
        SELECT extract(epoch FROM j.finished_at - j.claimed_at) AS seconds
        FROM {schema}.job AS j
        WHERE j.queue = qs.name AND j.status = 'done'
          AND j.finished_at >= (SELECT since FROM span)
        ORDER BY j.finished_at DESC
        LIMIT %(sample)s
    ) AS d
    WHERE d.seconds IS NOT NULL
    GROUP BY qs.name
),
minutes AS (
    SELECT generate_series(span.since, span.now_minute, interval '1 minute') AS start
    FROM span
)
SELECT qs.name,
       array_agg(m.start ORDER BY m.start),
       array_agg(coalesce(c.done, 0) ORDER BY m.start),
       array_agg(coalesce(c.failed, 0) ORDER BY m.start),
       d.p[1], d.p[2], d.p[3],
       EXISTS (SELECT 1 FROM recent AS r WHERE r.queue = qs.name AND r.position > %(cap)s)
FROM queues AS qs
CROSS JOIN minutes AS m
LEFT JOIN counted AS c ON c.queue = qs.name AND c.start = m.start
LEFT JOIN durations AS d ON d.queue = qs.name
GROUP BY qs.name, d.p
ORDER BY qs.name
