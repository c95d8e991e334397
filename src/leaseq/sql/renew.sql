-- Extend a batch of leases, each fenced by (job_id, lease_version) and a live
-- lease; a NULL lease keeps the job's current lease duration.
-- A row another transaction holds locked (a handler's completing transaction, an
-- operator's UPDATE) is skipped, never waited for: one locked row must not hold
-- up the renewal of every other lease in the batch. FOR NO KEY UPDATE is the lock
-- the UPDATE itself takes, so a referencing row's FOR KEY SHARE skips nothing.
-- Rows as every fenced batch write returns them (see complete.sql): one per
-- lease renewed (written: lease_until, the new lease), then one per claim as the
-- statement's snapshot saw it: busy = true when its lease was live there but its
-- row was locked right now (try again), else lost. A written row wins.
-- A live lease is tested as `lease_until > clock()` alone: only a running job
-- has a lease (job_check1), and without `status = 'running'` the partial lease
-- index is no candidate, so each claim is found by its primary key even when
-- stale statistics say one job runs while thousands do (a renewal of 10 leases
-- with 5,000 running read the whole lease index 10 times: 17 ms).
WITH claimed AS (
    SELECT *
    FROM unnest(%(job_ids)b::bigint[], %(lease_versions)b::bigint[],
                %(leases)s::double precision[])
        AS c (job_id, lease_version, lease_seconds)
),
-- Each claim's lease columns ride along, so that the UPDATE reads this list
-- alone (a join of two lists would compare every claim with every other).
locked AS (
    SELECT j.job_id, c.lease_version, c.lease_seconds
    FROM claimed AS c
    JOIN {schema}.job AS j ON j.job_id = c.job_id
    WHERE j.lease_version = c.lease_version
      AND j.lease_until > {schema}.clock()
    FOR NO KEY UPDATE OF j SKIP LOCKED
),
renewed AS (
    UPDATE {schema}.job AS j
    SET lease_seconds = coalesce(l.lease_seconds, j.lease_seconds),
        lease_until = {schema}.clock()
            + make_interval(secs => coalesce(l.lease_seconds, j.lease_seconds))
    FROM locked AS l
    WHERE j.job_id = l.job_id
      AND j.lease_version = l.lease_version
      AND j.lease_until > {schema}.clock()
    RETURNING j.job_id, j.lease_until
)
SELECT renewed.job_id, true AS written, renewed.lease_until, false AS busy
FROM renewed
UNION ALL
SELECT c.job_id, false, NULL, live.job_id IS NOT NULL
FROM claimed AS c
LEFT JOIN {schema}.job AS live
    ON live.job_id = c.job_id
   AND live.lease_version = c.lease_version
   AND live.lease_until > {schema}.clock()
