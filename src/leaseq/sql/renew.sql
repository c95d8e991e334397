-- Extend a batch of leases, each fenced by (job_id, lease_version) and a live
-- lease; a NULL lease keeps the job's current lease duration.
-- A row another transaction holds locked (a handler's completing transaction, an
-- operator's UPDATE) is skipped, never waited for: one locked row must not hold
-- up the renewal of every other lease in the batch. FOR NO KEY UPDATE is the lock
-- the UPDATE itself takes, so a referencing row's FOR KEY SHARE skips nothing.
-- Per claim: lease_until is the new lease (renewed); or NULL with busy = true
-- (locked right now while this statement's snapshot still shows the claim's live
-- lease: try again); or NULL with busy = false (lost).
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
live AS (
    SELECT j.job_id
    FROM {schema}.job AS j
    JOIN claimed AS c ON c.job_id = j.job_id
    WHERE j.lease_version = c.lease_version
      AND j.lease_until > {schema}.clock()
),
locked AS (
    SELECT j.job_id
    FROM {schema}.job AS j
    JOIN claimed AS c ON c.job_id = j.job_id
    WHERE j.lease_version = c.lease_version
      AND j.lease_until > {schema}.clock()
    FOR NO KEY UPDATE OF j SKIP LOCKED
),
renewed AS (
    UPDATE {schema}.job AS j
    SET lease_seconds = coalesce(c.lease_seconds, j.lease_seconds),
        lease_until = {schema}.clock()
            + make_interval(secs => coalesce(c.lease_seconds, j.lease_seconds))
    FROM claimed AS c
    JOIN locked AS l ON l.job_id = c.job_id
    WHERE j.job_id = c.job_id
      AND j.lease_version = c.lease_version
      AND j.lease_until > {schema}.clock()
    RETURNING j.job_id, j.lease_until
)
SELECT c.job_id, renewed.lease_until,
       renewed.job_id IS NULL AND live.job_id IS NOT NULL AS busy
FROM claimed AS c
LEFT JOIN renewed ON renewed.job_id = c.job_id
LEFT JOIN live ON live.job_id = c.job_id
