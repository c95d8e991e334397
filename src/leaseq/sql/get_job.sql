SELECT job_id, queue, payload, payload_bytes, status, priority, available_at, lease_until,
       lease_version, attempts, max_attempts, ordering_key, ordering_seq, idempotency_key,
       last_error, history, created_at, claimed_at, finished_at
FROM {schema}.job
WHERE job_id = %(job_id)s
