-- Give a batch of claims back for another attempt, each fenced by
-- (job_id, lease_version) and a live lease. A NULL delay takes the queue's
-- backoff; a job with no attempts left goes to 'failed' instead.
-- Not strict (the worker's acknowledgement), a retry this claim already
-- committed is accepted with the status it produced: matched by the UPDATE
-- itself while it is the row's last write (so a resend racing the first
-- commit waits for it and then matches, changing nothing), else found in the
-- history. Strict (inside a caller's transaction), only a live claim matches.
-- A live lease is tested as `lease_until > clock()` alone: only a running job
-- has a lease (job_check1), and without `status = 'running'` the partial lease
-- index is no candidate, so each claim is found by its primary key even when
-- stale statistics say one job runs while thousands do (a renewal of 10 leases
-- with 5,000 running read the whole lease index 10 times: 17 ms).
WITH claimed AS (
    SELECT *
    FROM unnest(%(job_ids)b::bigint[], %(lease_versions)b::bigint[],
                %(delays)s::double precision[], %(errors)s::text[])
        AS c (job_id, lease_version, delay, error)
),
retried AS (
    UPDATE {schema}.job AS j
    SET status = CASE WHEN j.status <> 'running' THEN j.status
                      WHEN j.attempts >= j.max_attempts THEN 'failed'
                      ELSE 'queued' END,
        available_at = CASE WHEN j.status <> 'running' OR j.attempts >= j.max_attempts
            THEN j.available_at
            ELSE {schema}.clock() + make_interval(secs => coalesce(
                c.delay,
                {schema}.backoff_seconds(j.attempts, q.backoff_base_seconds, q.backoff_cap_seconds)))
            END,
        lease_until = NULL,
        finished_at = CASE WHEN j.status = 'running' AND j.attempts >= j.max_attempts
            THEN {schema}.clock() ELSE j.finished_at END,
        last_error = CASE WHEN j.status <> 'running' THEN j.last_error
            ELSE coalesce(c.error, j.last_error) END,
        history = CASE WHEN j.status <> 'running' THEN j.history
            ELSE {schema}.history_append(j.history, jsonb_build_object(
                'attempt', j.attempts, 'at', {schema}.clock(), 'error', c.error,
                'outcome', CASE WHEN j.attempts >= j.max_attempts THEN 'failed' ELSE 'retry' END,
                'write', 'retry', 'lease_version', j.lease_version,
                'claimed_at', j.claimed_at, 'renewed_at', j.lease_until - make_interval(secs => j.lease_seconds)))
            END
    FROM claimed AS c, {schema}.queue AS q
    WHERE j.job_id = c.job_id
      AND q.name = j.queue
      AND j.lease_version = c.lease_version
      AND (j.lease_until > {schema}.clock()
           OR (NOT %(strict)s AND j.status IN ('queued', 'failed')
               AND j.history -> -1 @> jsonb_build_object(
                   'write', 'retry', 'lease_version', c.lease_version)))
    RETURNING j.job_id, j.status, j.result_awaited
),
-- A retry with no attempts left fails the job: one someone waits for
-- (wait_result) is named on the results channel, as fail.sql does.
notified AS (
    SELECT count(pg_notify(%(results_channel)s::text, retried.job_id::text)) AS sent
    FROM retried
    WHERE retried.status = 'failed' AND retried.result_awaited
      AND %(results_channel)s::text IS NOT NULL
)
-- Rows as every fenced batch write returns them (see complete.sql): one per
-- job retried (written: its new status), then one per claim as the statement's
-- snapshot saw it: not strict, the status this claim's own earlier retry
-- produced, found in the history of a job that has moved on since; else NULL
-- (lost). A written row wins.
SELECT retried.job_id, true AS written, retried.status
FROM retried
CROSS JOIN notified
UNION ALL
SELECT c.job_id, false,
       CASE earlier.outcome WHEN 'retry' THEN 'queued' WHEN 'failed' THEN 'failed' END
FROM claimed AS c
{fragment:claimed_job_as_seen}
LEFT JOIN LATERAL (
    SELECT entry ->> 'outcome' AS outcome
    FROM jsonb_array_elements(before.history) AS entry
    -- (the containment first: a history without this claim's retry is not expanded)
    WHERE NOT %(strict)s
      AND before.history @> jsonb_build_array(
          jsonb_build_object('write', 'retry', 'lease_version', c.lease_version))
      AND entry @> jsonb_build_object('write', 'retry', 'lease_version', c.lease_version)
    LIMIT 1
) AS earlier ON true
