-- Extend one lease, fenced by (job_id, lease_version) and a live lease; a NULL
-- lease keeps the job's current lease duration. Unlike the batch renewal this
-- waits for a row another transaction holds locked, like every single-claim
-- fenced write, so its caller gets a definite answer. No row: the lease is lost.
-- A live lease is tested as `lease_until > clock()` alone: only a running job
-- has a lease (job_check1), and without `status = 'running'` the partial lease
-- index is no candidate, so each claim is found by its primary key even when
-- stale statistics say one job runs while thousands do (a renewal of 10 leases
-- with 5,000 running read the whole lease index 10 times: 17 ms).
UPDATE {schema}.job AS j
SET lease_seconds = coalesce(%(lease)s::double precision, j.lease_seconds),
    lease_until = {schema}.clock()
        + make_interval(secs => coalesce(%(lease)s::double precision, j.lease_seconds))
WHERE j.job_id = %(job_id)s
  AND j.lease_version = %(lease_version)s
  AND j.lease_until > {schema}.clock()
RETURNING j.lease_until
