-- Per queue: jobs done and failed per minute over the last %(minutes)s minutes
-- (by the schema's clock, every minute present, oldest first) and the
-- durations (claim to finish, seconds) of the done ones. Each queue and state
-- is one range of job_finished_idx (queue, status, finished_at): the newest
-- %(cap)s of each are read at most, and the last column tells when a range had
-- more (a busy queue: the counts are a floor, the durations a sample).
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
    SELECT qs.name AS queue, s.status, r.finished_at, r.claimed_at, r.position
    FROM queues AS qs
    CROSS JOIN (VALUES ('done'), ('failed')) AS s (status)
    CROSS JOIN LATERAL (
        SELECT j.finished_at, j.claimed_at,
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
    SELECT r.queue,
           percentile_cont(ARRAY[0.5, 0.95, 0.99]) WITHIN GROUP (
               ORDER BY extract(epoch FROM r.finished_at - r.claimed_at)) AS p
    FROM recent AS r
    WHERE r.status = 'done' AND r.claimed_at IS NOT NULL AND r.position <= %(cap)s
    GROUP BY r.queue
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
