-- What prune.sql and prune_archive.sql would remove now, counted without
-- locking or writing anything (a dry run): the same targets and rules, the
-- whole range instead of one batch. Returns (action, queue, status, jobs):
-- 'deleted' or 'archived' (from job), 'expired' (from job_archive).
WITH settings AS (
    SELECT q.name, q.ordering_policy, q.retention_mode, q.retain_archived_seconds,
           q.retain_done_seconds, q.retain_cancelled_seconds, q.retain_failed_seconds
    FROM {schema}.queue AS q
    WHERE %(queue)s::text IS NULL OR q.name = %(queue)s::text
),
targets AS (
    SELECT s.name AS queue, t.status,
           s.retention_mode = 'archive' AS archive,
           s.ordering_policy = 'block' AS keeps_keyed_failed,
           {schema}.clock()
               - make_interval(secs => coalesce(%(older_than)s::double precision, t.retain))
               AS cutoff
    FROM settings AS s
    CROSS JOIN LATERAL (VALUES ('done', s.retain_done_seconds),
                               ('cancelled', s.retain_cancelled_seconds),
                               ('failed', s.retain_failed_seconds)) AS t (status, retain)
    WHERE t.status = ANY (%(states)s::text[])
      AND coalesce(%(older_than)s::double precision, t.retain) IS NOT NULL
),
archive_targets AS (
    SELECT s.name AS queue,
           {schema}.clock()
               - make_interval(secs => coalesce(%(archived_older_than)s::double precision,
                                                s.retain_archived_seconds))
               AS cutoff
    FROM settings AS s
    WHERE coalesce(%(archived_older_than)s::double precision, s.retain_archived_seconds)
          IS NOT NULL
),
removed AS (
    SELECT t.queue, t.status, t.archive, count(*) AS jobs
    FROM targets AS t
    JOIN {schema}.job AS j
      ON j.queue = t.queue AND j.status = t.status AND j.finished_at < t.cutoff
     AND j.status IN ('done', 'cancelled', 'failed')
     AND NOT (t.keeps_keyed_failed AND j.status = 'failed' AND j.ordering_key IS NOT NULL)
    GROUP BY 1, 2, 3
),
expired AS (
    SELECT t.queue, a.status, count(*) AS jobs
    FROM archive_targets AS t
    JOIN {schema}.job_archive AS a
      ON a.queue = t.queue AND a.archived_at < t.cutoff AND a.status = ANY (%(states)s::text[])
    GROUP BY 1, 2
    UNION ALL
    -- Archived by this very run and kept no time at all (an archive retention of
    -- 0 seconds): the run's archive batch expires them too.
    SELECT r.queue, r.status, r.jobs
    FROM removed AS r
    JOIN archive_targets AS t ON t.queue = r.queue AND t.cutoff >= {schema}.clock()
    WHERE r.archive
)
SELECT CASE WHEN r.archive THEN 'archived' ELSE 'deleted' END, r.queue, r.status, r.jobs
FROM removed AS r
UNION ALL
SELECT 'expired', e.queue, e.status, sum(e.jobs)::bigint
FROM expired AS e
GROUP BY 2, 3
ORDER BY 2, 3, 1
