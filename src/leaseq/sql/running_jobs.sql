-- Running jobs, the lease that ends first first: expired leases (waiting for
-- recovery by the next claim or the reaper) lead. Through job_lease_idx (queue,
-- lease_until, job_id) WHERE running: as many rows as jobs run, whatever the
-- table's size.
SELECT job_id, queue, payload, payload_bytes, status, priority, available_at, lease_until,
       lease_version, attempts, max_attempts, ordering_key, ordering_seq, idempotency_key,
       last_error, history, created_at, claimed_at, finished_at,
       extract(epoch FROM lease_until - {schema}.clock())::double precision,
       NULL::bigint, unique_key, timeout_seconds, group_key
FROM {schema}.job
WHERE status = 'running'
  AND (%(queue)s::text IS NULL OR queue = %(queue)s::text)
ORDER BY lease_until, job_id
LIMIT %(limit)s
