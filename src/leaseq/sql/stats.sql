-- Per queue: jobs by status, queued bytes, the age of the oldest ready job and
-- running jobs whose lease has expired, at a cost that does not grow with the
-- finished rows (what monitoring scrapes every few seconds).
--
-- Exact, from the partial indexes (a cost that grows with the backlog only):
-- queued (the ready indexes, ungrouped and grouped, plus a key's waiting jobs
-- through the ordering index), queued bytes, the oldest ready job (a key's waiting jobs are not
-- ready: they wait for their head), running and expired leases; failed up to
-- 10,000 per queue (the failed-jobs index, LIMIT 10001).
-- Finished counts need no index while the job table is small (up to
-- %(exact_pages)s pages, 1024 = 8 MiB): one scan counts them. Past that they are estimates that read
-- no job row: the queue's live rows (the statistics system's live-tuple count
-- of the table, current within seconds, times the queue's share of rows at the
-- last ANALYZE) minus its exact unfinished jobs, split between done and
-- cancelled (and failed, past 10,000) by their shares of the whole table at
-- the last ANALYZE (per-column statistics: the table's mix, not the queue's).
-- The last column names the statuses whose count is such an estimate.
WITH size AS (
    SELECT pg_relation_size(c.oid)
               <= %(exact_pages)s * current_setting('block_size')::bigint AS small,
           CASE
               WHEN pg_stat_get_live_tuples(c.oid) > 0 THEN pg_stat_get_live_tuples(c.oid)
               WHEN c.reltuples > 0 AND c.relpages > 0
                   THEN c.reltuples / c.relpages
                        * (pg_relation_size(c.oid) / current_setting('block_size')::bigint)
               ELSE 0
           END::double precision AS live_rows
    FROM pg_class AS c
    WHERE c.oid = '{schema}.job'::regclass
),
-- Value frequencies of queue and status in the sample of the last ANALYZE.
frequency AS MATERIALIZED (
    SELECT s.attname, v.value, v.freq::double precision AS freq
    FROM pg_stats AS s,
         unnest(s.most_common_vals::text::text[], s.most_common_freqs) AS v(value, freq)
    WHERE NOT (SELECT small FROM size)
      AND s.schemaname = %(schema)s AND s.tablename = 'job'
      AND s.attname IN ('queue', 'status')
),
queues AS (
    SELECT q.name, q.paused
    FROM {schema}.queue AS q
    WHERE %(queue)s::text IS NULL OR q.name = %(queue)s::text
),
shares AS (
    SELECT (SELECT count(*) FROM {schema}.queue) AS queue_count,
           -- Never analyzed (autovacuum off, or not yet): no queue's share is known.
           EXISTS (SELECT 1 FROM pg_stats AS s
                   WHERE NOT (SELECT small FROM size)
                     AND s.schemaname = %(schema)s AND s.tablename = 'job'
                     AND s.attname = 'queue') AS analyzed,
           (SELECT count(*) FROM frequency WHERE attname = 'queue') AS known_queues,
           coalesce((SELECT sum(freq) FROM frequency WHERE attname = 'queue'), 0) AS known_share,
           coalesce((SELECT sum(freq) FROM frequency
                     WHERE attname = 'status' AND value = 'done'), 0) AS done,
           coalesce((SELECT sum(freq) FROM frequency
                     WHERE attname = 'status' AND value = 'failed'), 0) AS failed,
           coalesce((SELECT sum(freq) FROM frequency
                     WHERE attname = 'status' AND value = 'cancelled'), 0) AS cancelled
),
-- Only for a small table (a one-time filter: a large one is never scanned).
exact AS MATERIALIZED (
    SELECT j.queue, j.status, count(*) AS n
    FROM {schema}.job AS j
    WHERE (SELECT small FROM size) AND j.status IN ('done', 'failed', 'cancelled')
    GROUP BY j.queue, j.status
),
per_queue AS MATERIALIZED (
    SELECT q.name, q.paused,
           ready.n + waiting.n AS queued,
           ready.bytes + waiting.bytes AS queued_bytes,
           ready.oldest,
           running.n AS running,
           running.expired,
           failed.n AS failed_seen,
           -- The queue's live rows now: its share of the table's (the rest of the
           -- sample's shared by the queues it did not name; before any ANALYZE, all
           -- of it for the only queue, and none known for several: an equal split
           -- gave a queue that never ran a job thousands of "done" ones).
           (SELECT live_rows FROM size) * coalesce(
               (SELECT f.freq FROM frequency AS f
                WHERE f.attname = 'queue' AND f.value = q.name),
               CASE
                   WHEN sh.queue_count = 1 THEN 1
                   WHEN sh.analyzed
                       THEN (1 - sh.known_share) / greatest(sh.queue_count - sh.known_queues, 1)
                   ELSE 0
               END
           ) - ready.n - waiting.n - running.n AS finished_estimate,
           sh.done AS done_share, sh.failed AS failed_share, sh.cancelled AS cancelled_share
    FROM queues AS q
    CROSS JOIN shares AS sh
    CROSS JOIN LATERAL (
        SELECT count(*) AS n, coalesce(sum(r.payload_bytes), 0) AS bytes,
               min(r.available_at) FILTER (WHERE r.available_at <= {schema}.clock()) AS oldest
        FROM (
            -- Ungrouped and grouped ready jobs: one partial index each.
            SELECT j.payload_bytes, j.available_at
            FROM {schema}.job AS j
            WHERE j.queue = q.name AND j.status = 'queued' AND NOT j.blocked
              AND j.group_key IS NULL
            UNION ALL
            SELECT j.payload_bytes, j.available_at
            FROM {schema}.job AS j
            WHERE j.queue = q.name AND j.status = 'queued' AND NOT j.blocked
              AND j.group_key IS NOT NULL
        ) AS r
    ) AS ready
    CROSS JOIN LATERAL (
        SELECT count(*) AS n, coalesce(sum(j.payload_bytes), 0) AS bytes
        FROM {schema}.job AS j
        WHERE j.queue = q.name AND j.ordering_key IS NOT NULL
          AND j.status = 'queued' AND j.blocked
    ) AS waiting
    CROSS JOIN LATERAL (
        SELECT count(*) AS n,
               count(*) FILTER (WHERE j.lease_until <= {schema}.clock()) AS expired
        FROM {schema}.job AS j
        WHERE j.queue = q.name AND j.status = 'running'
    ) AS running
    CROSS JOIN LATERAL (
        SELECT count(*) AS n
        FROM (SELECT 1 FROM {schema}.job AS j
              WHERE j.queue = q.name AND j.status = 'failed'
              LIMIT 10001) AS f
    ) AS failed
),
counted AS MATERIALIZED (
    SELECT p.*,
           (SELECT small FROM size) AS small,
           greatest(p.finished_estimate, 0) AS finished,
           CASE
               WHEN p.failed_seen <= 10000 THEN p.failed_seen
               ELSE greatest(
                   10001,
                   round(greatest(p.finished_estimate, 0) * p.failed_share
                         / nullif(p.done_share + p.failed_share + p.cancelled_share, 0)))
           END AS failed_count
    FROM per_queue AS p
)
SELECT c.name, c.queued, c.running,
       CASE WHEN c.small
           THEN coalesce((SELECT e.n FROM exact AS e
                          WHERE e.queue = c.name AND e.status = 'done'), 0)
           ELSE round(greatest(c.finished - c.failed_count, 0)
                      * coalesce(c.done_share / nullif(c.done_share + c.cancelled_share, 0), 1))
       END::bigint,
       CASE WHEN c.small
           THEN coalesce((SELECT e.n FROM exact AS e
                          WHERE e.queue = c.name AND e.status = 'failed'), 0)
           ELSE c.failed_count
       END::bigint,
       CASE WHEN c.small
           THEN coalesce((SELECT e.n FROM exact AS e
                          WHERE e.queue = c.name AND e.status = 'cancelled'), 0)
           ELSE round(greatest(c.finished - c.failed_count, 0)
                      * coalesce(c.cancelled_share / nullif(c.done_share + c.cancelled_share, 0), 0))
       END::bigint,
       c.queued_bytes,
       -- A paused queue has no job a worker could claim now (and its age must
       -- not page anyone: the pause is deliberate).
       CASE WHEN NOT c.paused
           THEN extract(epoch FROM {schema}.clock() - c.oldest)::double precision
       END,
       c.expired,
       c.paused,
       CASE
           WHEN c.small THEN ARRAY[]::text[]
           WHEN c.failed_seen > 10000 THEN ARRAY['done', 'failed', 'cancelled']
           ELSE ARRAY['done', 'cancelled']
       END
FROM counted AS c
ORDER BY c.name
