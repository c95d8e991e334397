-- One page of jobs matching the filters, newest first, after the keyset
-- %(before)s. Only the newest %(window)s job ids are searched: the primary key
-- is read backwards from `before` down to max(job_id) - window at most, so a
-- search costs the same over a million finished rows as over a hundred, and a
-- filter that matches nothing stops at the window's edge. One row more than
-- the page is asked for, to tell whether another page follows. Error text
-- matches case-insensitively as a substring; payload fields by containment.
-- Always one row at least (NULL job columns when nothing matched) carrying the
-- window's floor, so the caller can tell whether older jobs were left unsearched,
-- and its top. A later page passes the top back (%(top)s): its window is the
-- first page's, however many jobs came since (else each new job would push one
-- of that window, not shown yet, out of the next page's). Never above the
-- newest job id, and ids above it are not read: %(window)s ids at most still.
WITH edge AS (
    SELECT t.top, t.top - %(window)s AS floor
    FROM (SELECT least(coalesce(max(j.job_id), 0), %(top)s::bigint) AS top
          FROM {schema}.job AS j) AS t
)
SELECT found.*, edge.floor, edge.top
FROM edge
LEFT JOIN LATERAL (
    SELECT j.job_id, j.queue, j.payload, j.payload_bytes, j.status, j.priority, j.available_at,
           j.lease_until, j.lease_version, j.attempts, j.max_attempts, j.ordering_key,
           j.ordering_seq, j.idempotency_key, j.last_error, j.history, j.created_at,
           j.claimed_at, j.finished_at,
           CASE WHEN j.status = 'running'
                THEN extract(epoch FROM j.lease_until - {schema}.clock())::double precision
           END AS lease_remaining,
           NULL::bigint AS ahead, j.unique_key, j.timeout_seconds, j.group_key
    FROM {schema}.job AS j
    WHERE j.job_id > edge.floor AND j.job_id <= edge.top
      AND (%(before)s::bigint IS NULL OR j.job_id < %(before)s::bigint)
      AND (%(status)s::text IS NULL OR j.status = %(status)s::text)
      AND (%(queue)s::text IS NULL OR j.queue = %(queue)s::text)
      AND (%(key)s::text IS NULL OR j.ordering_key = %(key)s::text)
      AND (%(error)s::text IS NULL OR strpos(lower(j.last_error), lower(%(error)s::text)) > 0)
      AND (%(payload)s::jsonb IS NULL OR j.payload @> %(payload)s::jsonb)
    ORDER BY j.job_id DESC
    LIMIT %(limit)s + 1
) AS found ON true
ORDER BY found.job_id DESC
