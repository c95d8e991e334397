-- Fail a batch of claims for good, each fenced by (job_id, lease_version) and
-- a live lease. Lost leases come back with accepted = false.
-- Not strict (the worker's acknowledgement), a fail this claim already
-- committed is accepted: matched by the UPDATE itself while it is the row's
-- last write (so a resend racing the first commit waits for it and then
-- matches), else found in the history (the job has moved on since: the
-- resend changes nothing). Strict (inside a caller's transaction), only a
-- live claim matches.
-- A live lease is tested as `lease_until > clock()` alone: only a running job
-- has a lease (job_check1), and without `status = 'running'` the partial lease
-- index is no candidate, so each claim is found by its primary key even when
-- stale statistics say one job runs while thousands do (a renewal of 10 leases
-- with 5,000 running read the whole lease index 10 times: 17 ms).
WITH claimed AS (
    SELECT *
    FROM unnest(%(job_ids)b::bigint[], %(lease_versions)b::bigint[], %(errors)s::text[])
        AS c (job_id, lease_version, error)
),
failed AS (
    UPDATE {schema}.job AS j
    SET status = 'failed',
        lease_until = NULL,
        finished_at = CASE WHEN j.status = 'running' THEN {schema}.clock() ELSE j.finished_at END,
        last_error = CASE WHEN j.status = 'running' THEN c.error ELSE j.last_error END,
        history = CASE WHEN j.status = 'running'
            THEN {schema}.history_append(j.history, jsonb_build_object(
                'attempt', j.attempts, 'at', {schema}.clock(), 'error', c.error,
                'outcome', 'failed', 'write', 'fail', 'lease_version', j.lease_version,
                'claimed_at', j.claimed_at, 'renewed_at', j.lease_until - make_interval(secs => j.lease_seconds)))
            ELSE j.history END
    FROM claimed AS c
    WHERE j.job_id = c.job_id
      AND j.lease_version = c.lease_version
      AND (j.lease_until > {schema}.clock()
           OR (NOT %(strict)s AND j.status = 'failed'
               AND j.history -> -1 @> jsonb_build_object(
                   'write', 'fail', 'lease_version', c.lease_version)))
    RETURNING j.job_id, j.result_awaited
),
-- A job someone waits for (wait_result) is named on the results channel.
notified AS (
    SELECT count(pg_notify(%(results_channel)s::text, failed.job_id::text)) AS sent
    FROM failed
    WHERE failed.result_awaited AND %(results_channel)s::text IS NOT NULL
)
-- Rows as every fenced batch write returns them (see complete.sql): one per
-- job this statement changed (written), then one per claim as the statement's
-- snapshot saw it: accepted when this claim's own fail had committed before
-- (a resend), unless strict. A written row wins.
SELECT failed.job_id, true AS written, true AS accepted
FROM failed
CROSS JOIN notified
UNION ALL
SELECT c.job_id, false,
       NOT %(strict)s AND coalesce(before.history @> jsonb_build_array(
           jsonb_build_object('write', 'fail', 'lease_version', c.lease_version)), false)
FROM claimed AS c
{fragment:claimed_job_as_seen}
