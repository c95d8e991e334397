-- One bounded batch of retention: up to %(limit)s finished jobs past their
-- queue's retention for their state (or, given, older than %(older_than)s
-- seconds), oldest first within each queue and state, deleted or, for a queue
-- in 'archive' mode, moved to job_archive by this same statement.
-- * Finished jobs only: the DELETE re-checks the status on the row it locked,
--   so a job replayed meanwhile is left alone; queued and running jobs are
--   never candidates.
-- * SKIP LOCKED: a row some transaction is writing (a replay, a cancel) is
--   skipped, never waited for, and no claim ever waits for this batch (claims
--   lock queued and running rows only).
-- * Under the 'block' policy a failed job of an ordering key is never removed:
--   it holds its key until an operator replays or cancels (skips) it. The
--   queue rows are read FOR SHARE, so a change of ordering policy
--   (configure_queue updates the row) and a batch never interleave.
-- * Admission counters stay exact without a write: a job leaves the backlog
--   counters when it finishes (job_backlog_count), so removing finished rows
--   changes nothing there.
-- * With %(actor)s (an operator's prune: the CLI's), one audit row per queue
--   holds the ids this batch removed, in this same statement; the maintenance
--   leader's retention passes none, and is not audited.
-- Returns (action, queue, status, jobs): action is 'deleted' or 'archived'.
WITH settings AS MATERIALIZED (
    SELECT q.name, q.ordering_policy, q.retention_mode,
           q.retain_done_seconds, q.retain_cancelled_seconds, q.retain_failed_seconds
    FROM {schema}.queue AS q
    WHERE %(queue)s::text IS NULL OR q.name = %(queue)s::text
    ORDER BY q.name
    FOR SHARE OF q
),
targets AS (
    SELECT s.name AS queue, t.status,
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
-- Per target, the head of its range of job_finished_idx; LIMIT on the whole.
picked AS MATERIALIZED (
    SELECT p.job_id
    FROM targets AS t
    CROSS JOIN LATERAL (
        SELECT j.job_id
        FROM {schema}.job AS j
        WHERE j.queue = t.queue AND j.status = t.status AND j.finished_at < t.cutoff
          -- (t.status is known at run time only: the planner proves the partial
          -- index's `finished_at IS NOT NULL` from the comparison above; this
          -- line keeps the statement right without that index's help)
          AND j.status IN ('done', 'cancelled', 'failed')
          AND NOT (t.keeps_keyed_failed AND j.status = 'failed' AND j.ordering_key IS NOT NULL)
        ORDER BY j.finished_at, j.job_id
        LIMIT %(limit)s
        FOR UPDATE OF j SKIP LOCKED
    ) AS p
    LIMIT %(limit)s
),
-- By primary key lookups of the ids picked (never a join the planner could turn
-- into a scan of the table).
removed AS (
    DELETE FROM {schema}.job AS j
    WHERE j.job_id = ANY (ARRAY(SELECT p.job_id FROM picked AS p))
      AND j.status IN ('done', 'cancelled', 'failed')
    RETURNING j.*
),
archived AS (
    INSERT INTO {schema}.job_archive (
        job_id, queue, payload, payload_bytes, status, priority, available_at, lease_until,
        lease_seconds, lease_version, attempts, max_attempts, ordering_key, ordering_seq,
        idempotency_key, last_error, history, counted, created_at, claimed_at, finished_at,
        blocked, trace_context, timeout_seconds, result, result_awaited, unique_key, unique_for,
        unique_held, group_key, limited, deferred, archived_at)
    SELECT r.job_id, r.queue, r.payload, r.payload_bytes, r.status, r.priority, r.available_at,
           r.lease_until, r.lease_seconds, r.lease_version, r.attempts, r.max_attempts,
           r.ordering_key, r.ordering_seq, r.idempotency_key, r.last_error, r.history,
           r.counted, r.created_at, r.claimed_at, r.finished_at, r.blocked, r.trace_context,
           r.timeout_seconds, r.result, r.result_awaited, r.unique_key, r.unique_for,
           r.unique_held, r.group_key, r.limited, r.deferred,
           {schema}.clock()
    FROM removed AS r
    JOIN settings AS s ON s.name = r.queue
    WHERE s.retention_mode = 'archive'
),
counted AS (
    SELECT r.queue, r.status, count(*) AS jobs
    FROM removed AS r
    WHERE %(actor)s::text IS NOT NULL
    GROUP BY r.queue, r.status
),
audit AS (
    INSERT INTO {schema}.audit (at, actor, action, queue, job_ids, detail)
    SELECT {schema}.clock(), %(actor)s::text, 'prune', c.queue,
           ARRAY(SELECT r.job_id FROM removed AS r WHERE r.queue = c.queue ORDER BY r.job_id),
           jsonb_build_object(
               'removed', CASE WHEN s.retention_mode = 'archive' THEN 'archived' ELSE 'deleted' END,
               'jobs', jsonb_object_agg(c.status, c.jobs),
               'older_than', %(older_than)s::double precision)
    FROM counted AS c
    JOIN settings AS s ON s.name = c.queue
    GROUP BY c.queue, s.retention_mode
)
SELECT CASE WHEN s.retention_mode = 'archive' THEN 'archived' ELSE 'deleted' END,
       r.queue, r.status, count(*)
FROM removed AS r
JOIN settings AS s ON s.name = r.queue
GROUP BY 1, 2, 3
ORDER BY 2, 3, 1
