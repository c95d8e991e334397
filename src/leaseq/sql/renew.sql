-- Extend a batch of leases, each fenced by (job_id, lease_version) and a live
-- lease; a NULL lease keeps the job's current lease duration. Lost leases come
-- back with a NULL lease_until.
WITH claimed AS (
    SELECT *
    FROM unnest(%(job_ids)s::bigint[], %(lease_versions)s::bigint[],
                %(leases)s::double precision[])
        AS c (job_id, lease_version, lease_seconds)
),
renewed AS (
    UPDATE {schema}.job AS j
    SET lease_seconds = coalesce(c.lease_seconds, j.lease_seconds),
        lease_until = {schema}.clock()
            + make_interval(secs => coalesce(c.lease_seconds, j.lease_seconds))
    FROM claimed AS c
    WHERE j.job_id = c.job_id
      AND j.lease_version = c.lease_version
      AND j.status = 'running'
      AND j.lease_until > {schema}.clock()
    RETURNING j.job_id, j.lease_until
)
SELECT c.job_id, renewed.lease_until
FROM claimed AS c
LEFT JOIN renewed ON renewed.job_id = c.job_id
