-- Complete a batch of claims, each fenced by (job_id, lease_version) and a
-- live lease.
-- Not strict (the worker's own acknowledgement, where no effect rides on the
-- write): a claim whose completion already committed (a resend after an
-- ambiguous commit) matches too and changes nothing, so it is reported as
-- accepted. The duplicate is matched by the UPDATE itself, not by a separate
-- read: if the first completion is still committing, the UPDATE waits for its
-- row lock and then re-checks the newest row version, which a read of the
-- statement's snapshot would not see.
-- Strict (inside a caller's transaction, where a business effect commits with
-- the completion): only a live claim matches, so a re-run of the whole
-- transaction is refused and its effect rolls back; `already_done` says
-- whether the miss was this claim's own earlier completion, as the
-- statement's snapshot saw it. One that committed while this UPDATE waited
-- for the row's lock is not in that snapshot: the client asks again on a
-- strict miss (completed_by.sql, _steps.complete).
-- A live lease is tested as `lease_until > clock()` alone: only a running job
-- has a lease (job_check1), and without `status = 'running'` the partial lease
-- index is no candidate, so each claim is found by its primary key even when
-- stale statistics say one job runs while thousands do (a renewal of 10 leases
-- with 5,000 running read the whole lease index 10 times: 17 ms).
-- The id arrays go in binary (%(...)b): the driver's text form quotes each element.
-- Rows of two kinds (the same for every fenced batch write; the store reads
-- them): one per job this statement completed (written), then one per claim as
-- the statement's snapshot saw it (already_done: this claim's completion had
-- committed before). A claim's written row, when it has one, wins. Two lists,
-- never a join of the claims with the completions: the worker's sessions plan
-- without hash joins, so that join compared every claim with every completion
-- (N x N rows: a batch of 500 took 20 ms instead of 7).
-- Each job's result (the handler's return value as JSON text, NULL for None;
-- the whole array NULL when every one is) is written by the same fenced
-- UPDATE, so a result is stored only with its own claim's completion. A job
-- someone waits for (result_awaited, set by wait_result) is named by its id on
-- the results channel; the others notify nothing.
WITH claimed AS (
    SELECT *
    FROM unnest(%(job_ids)b::bigint[], %(lease_versions)b::bigint[], %(results)b::text[])
        AS c (job_id, lease_version, result)
),
completed AS (
    UPDATE {schema}.job AS j
    SET status = 'done',
        lease_until = NULL,
        finished_at = CASE WHEN j.status = 'done' THEN j.finished_at ELSE {schema}.clock() END,
        result = CASE WHEN j.status = 'done' THEN j.result ELSE c.result::jsonb END
    FROM claimed AS c
    WHERE j.job_id = c.job_id
      AND j.lease_version = c.lease_version
      AND (j.lease_until > {schema}.clock()
           -- Only a completion sets 'done', and only this claim had this version.
           OR (j.status = 'done' AND NOT %(strict)s))
    RETURNING j.job_id, j.result_awaited
),
notified AS (
    SELECT count(pg_notify(%(results_channel)s::text, completed.job_id::text)) AS sent
    FROM completed
    WHERE completed.result_awaited AND %(results_channel)s::text IS NOT NULL
)
SELECT completed.job_id, true AS written, true AS accepted, false AS already_done
FROM completed
CROSS JOIN notified
UNION ALL
SELECT c.job_id, false,
       -- Not strict, a completion this claim committed is accepted: the UPDATE
       -- matches it while the job is in job, this row once retention archived it.
       NOT %(strict)s
       AND coalesce(before.status = 'done' AND before.lease_version = c.lease_version, false),
       coalesce(before.status = 'done' AND before.lease_version = c.lease_version, false)
FROM claimed AS c
{fragment:claimed_job_as_seen}
