-- One bounded batch of the archive's own retention: up to %(limit)s jobs
-- archived longer ago than their queue's retain_archived_seconds (or, given,
-- %(older_than)s seconds), oldest first per queue, deleted. SKIP LOCKED: never
-- waits for another pruner. With %(actor)s, one audit row per queue holds the
-- ids removed (as prune.sql). Returns ('expired', queue, status, jobs).
WITH targets AS (
    SELECT q.name AS queue,
           {schema}.clock()
               - make_interval(secs => coalesce(%(older_than)s::double precision,
                                                q.retain_archived_seconds))
               AS cutoff
    FROM {schema}.queue AS q
    WHERE (%(queue)s::text IS NULL OR q.name = %(queue)s::text)
      AND coalesce(%(older_than)s::double precision, q.retain_archived_seconds) IS NOT NULL
),
picked AS MATERIALIZED (
    SELECT p.job_id
    FROM targets AS t
    CROSS JOIN LATERAL (
        SELECT a.job_id
        FROM {schema}.job_archive AS a
        WHERE a.queue = t.queue AND a.archived_at < t.cutoff
          AND a.status = ANY (%(states)s::text[])
        ORDER BY a.archived_at, a.job_id
        LIMIT %(limit)s
        FOR UPDATE OF a SKIP LOCKED
    ) AS p
    LIMIT %(limit)s
),
removed AS (
    DELETE FROM {schema}.job_archive AS a
    WHERE a.job_id = ANY (ARRAY(SELECT p.job_id FROM picked AS p))
    RETURNING a.job_id, a.queue, a.status
),
audit AS (
    INSERT INTO {schema}.audit (at, actor, action, queue, job_ids, detail)
    SELECT {schema}.clock(), %(actor)s::text, 'prune', r.queue,
           array_agg(r.job_id ORDER BY r.job_id),
           jsonb_build_object('removed', 'expired from archive',
                              'older_than', %(older_than)s::double precision)
    FROM removed AS r
    WHERE %(actor)s::text IS NOT NULL
    GROUP BY r.queue
)
SELECT 'expired', r.queue, r.status, count(*)
FROM removed AS r
GROUP BY 2, 3
ORDER BY 2, 3
