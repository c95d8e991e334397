-- Jobs by status and (optionally) queue, newest first; what operators page through.
SELECT job_id, queue, payload, payload_bytes, status, priority, available_at, lease_until,
       lease_version, attempts, max_attempts, ordering_key, ordering_seq, idempotency_key,
       last_error, history, created_at, claimed_at, finished_at,
       CASE WHEN status = 'running'
            THEN extract(epoch FROM lease_until - {schema}.clock())::double precision END,
       NULL::bigint, unique_key, timeout_seconds, group_key
FROM {schema}.job
WHERE status = %(status)s
  AND (%(queue)s::text IS NULL OR queue = %(queue)s::text)
ORDER BY job_id DESC
LIMIT %(limit)s
