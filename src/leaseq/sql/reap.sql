-- Fail up to %(limit)s jobs whose attempts are used up: queued ones, and
-- running ones whose lease has expired. A live lease is never touched: the
-- UPDATE re-checks the condition on the row it has locked.
WITH exhausted_queued AS (
    SELECT j.job_id, 'queued' AS was
    FROM {schema}.job AS j
    WHERE j.status = 'queued' AND j.attempts >= j.max_attempts
    -- In job_exhausted_idx's order: the planner takes a third of the queued rows
    -- for exhausted and, unordered, read the whole table instead of that (mostly
    -- empty) index, every round, once the rows had been rewritten.
    ORDER BY j.job_id
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
),
exhausted_expired AS (
    SELECT j.job_id, 'running' AS was
    FROM {schema}.job AS j
    WHERE j.status = 'running'
      AND j.lease_until <= {schema}.clock()
      AND j.attempts >= j.max_attempts
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
),
doomed AS (
    (SELECT job_id, was FROM exhausted_queued)
    UNION ALL
    (SELECT job_id, was FROM exhausted_expired)
    LIMIT %(limit)s
),
reaped AS (
    UPDATE {schema}.job AS j
    SET status = 'failed',
        lease_until = NULL,
        finished_at = {schema}.clock(),
        last_error = CASE WHEN j.status = 'running'
            THEN 'lease expired on the last attempt (' || j.attempts || ' of ' || j.max_attempts || ')'
            ELSE 'no attempts left (' || j.attempts || ' of ' || j.max_attempts || ')' END,
        history = {schema}.attempt_ended(j.history, j.attempts, j.lease_version, j.claimed_at,
            j.lease_until, j.lease_seconds,
            CASE WHEN j.status = 'running' THEN 'lease_expired' ELSE 'exhausted' END)
    FROM doomed
    WHERE j.job_id = doomed.job_id
      AND j.attempts >= j.max_attempts
      AND (j.status = 'queued'
           OR (j.status = 'running' AND j.lease_until <= {schema}.clock()))
    RETURNING j.job_id, doomed.was, j.result_awaited, j.queue
),
-- A job someone waits for (wait_result) is named on the results channel.
notified AS (
    SELECT count(pg_notify(%(results_channel)s::text, reaped.job_id::text)) AS sent
    FROM reaped
    WHERE reaped.result_awaited AND %(results_channel)s::text IS NOT NULL
)
-- Each job's queue: the leader counts what it failed per queue (no worker does:
-- theirs died with the jobs).
SELECT job_id, was, queue FROM reaped CROSS JOIN notified ORDER BY job_id
