-- Claim up to %(limit)s jobs of one queue: expired leases first (crash
-- recovery), then ready jobs in priority order. Each branch reads the head of
-- its own partial index under FOR UPDATE SKIP LOCKED with a LIMIT, so
-- concurrent claimers never wait for, nor take, each other's rows.
-- Eligibility is the same in both branches: attempts left, and no earlier
-- unfinished job of the same ordering key (a failed one counts under 'block').
-- The queue is compared with the parameter, not with settings.name: only a
-- constant lets the planner read the index in order and stop at the LIMIT.
WITH settings AS (
    SELECT q.name, q.lease_seconds, q.ordering_policy = 'block' AS failed_blocks
    FROM {schema}.queue AS q
    WHERE q.name = %(queue)s AND NOT q.paused
),
expired AS (
    SELECT j.job_id
    FROM {schema}.job AS j, settings AS s
    WHERE j.queue = %(queue)s
      AND j.status = 'running'
      AND j.lease_until <= {schema}.clock()
      AND j.attempts < j.max_attempts
      AND (j.ordering_key IS NULL OR NOT EXISTS (
          SELECT 1 FROM {schema}.job AS e
          WHERE e.queue = j.queue
            AND e.ordering_key = j.ordering_key
            AND (e.ordering_seq, e.job_id) < (j.ordering_seq, j.job_id)
            AND (e.status IN ('queued', 'running')
                 OR (e.status = 'failed' AND s.failed_blocks))))
    ORDER BY j.lease_until, j.job_id
    LIMIT %(limit)s
    FOR UPDATE OF j SKIP LOCKED
),
ready AS (
    SELECT j.job_id
    FROM {schema}.job AS j, settings AS s
    WHERE j.queue = %(queue)s
      AND j.status = 'queued'
      AND j.available_at <= {schema}.clock()
      AND j.attempts < j.max_attempts
      AND (j.ordering_key IS NULL OR NOT EXISTS (
          SELECT 1 FROM {schema}.job AS e
          WHERE e.queue = j.queue
            AND e.ordering_key = j.ordering_key
            AND (e.ordering_seq, e.job_id) < (j.ordering_seq, j.job_id)
            AND (e.status IN ('queued', 'running')
                 OR (e.status = 'failed' AND s.failed_blocks))))
    ORDER BY j.priority DESC, j.available_at, j.job_id
    LIMIT %(limit)s
    FOR UPDATE OF j SKIP LOCKED
),
picked AS (
    (SELECT job_id FROM expired)
    UNION ALL
    (SELECT job_id FROM ready)
    LIMIT %(limit)s
)
UPDATE {schema}.job AS j
SET status = 'running',
    lease_seconds = coalesce(%(lease)s::double precision, s.lease_seconds),
    lease_until = {schema}.clock()
        + make_interval(secs => coalesce(%(lease)s::double precision, s.lease_seconds)),
    lease_version = j.lease_version + 1,
    attempts = j.attempts + 1,
    claimed_at = {schema}.clock(),
    history = CASE WHEN j.status = 'running'
        THEN {schema}.history_append(j.history, jsonb_build_object(
            'attempt', j.attempts, 'at', {schema}.clock(), 'outcome', 'lease_expired'))
        ELSE j.history END
FROM picked, settings AS s
WHERE j.job_id = picked.job_id
RETURNING j.job_id, j.queue, j.payload, j.lease_version, j.attempts, j.max_attempts,
    j.ordering_key, j.ordering_seq, j.lease_until, j.lease_seconds, j.idempotency_key
