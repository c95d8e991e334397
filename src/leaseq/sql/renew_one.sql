-- Extend one lease, fenced by (job_id, lease_version) and a live lease; a NULL
-- lease keeps the job's current lease duration. Unlike the batch renewal this
-- waits for a row another transaction holds locked, like every single-claim
-- fenced write, so its caller gets a definite answer. No row: the lease is lost.
UPDATE {schema}.job AS j
SET lease_seconds = coalesce(%(lease)s::double precision, j.lease_seconds),
    lease_until = {schema}.clock()
        + make_interval(secs => coalesce(%(lease)s::double precision, j.lease_seconds))
WHERE j.job_id = %(job_id)s
  AND j.lease_version = %(lease_version)s
  AND j.status = 'running'
  AND j.lease_until > {schema}.clock()
RETURNING j.lease_until
