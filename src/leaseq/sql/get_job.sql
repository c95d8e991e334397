-- One job, with its lease's remaining seconds (running), how many unfinished
-- jobs of its ordering key come before it (through job_ordering_idx; capped),
-- and, queued under the `block` policy, the failed job of its key that holds it
-- back (blocked_by).
SELECT j.job_id, j.queue, j.payload, j.payload_bytes, j.status, j.priority, j.available_at,
       j.lease_until, j.lease_version, j.attempts, j.max_attempts, j.ordering_key,
       j.ordering_seq, j.idempotency_key, j.last_error, j.history, j.created_at, j.claimed_at,
       j.finished_at,
       CASE WHEN j.status = 'running'
            THEN extract(epoch FROM j.lease_until - {schema}.clock())::double precision END,
       -- Two range scans, each bounded by its keys: a row comparison bounds an
       -- index scan by its first column only, and every job of a key enqueued
       -- without seq= has seq 0 (the head of a 300,000-job key read them all).
       CASE WHEN j.ordering_key IS NOT NULL AND j.status IN ('queued', 'running') THEN (
           SELECT count(*) FROM (
               (SELECT 1 FROM {schema}.job AS o
                WHERE o.queue = j.queue AND o.ordering_key = j.ordering_key
                  AND o.status IN ('queued', 'running')
                  AND o.ordering_seq < j.ordering_seq
                LIMIT 100000)
               UNION ALL
               (SELECT 1 FROM {schema}.job AS o
                WHERE o.queue = j.queue AND o.ordering_key = j.ordering_key
                  AND o.status IN ('queued', 'running')
                  AND o.ordering_seq = j.ordering_seq AND o.job_id < j.job_id
                LIMIT 100000)
               LIMIT 100000) AS before_it)
       END,
       j.unique_key, j.timeout_seconds, j.group_key,
       -- The key's earliest failed job holds back every job after it under
       -- `block` (the default of a queue without settings): read first, then
       -- compared, so that it is one probe of job_failed_key_idx however many
       -- failed jobs the key has.
       CASE WHEN j.ordering_key IS NOT NULL AND j.status = 'queued'
                 AND coalesce((SELECT q.ordering_policy = 'block' FROM {schema}.queue AS q
                               WHERE q.name = j.queue), true) THEN (
           SELECT f.job_id FROM (
               SELECT f.job_id, f.ordering_seq FROM {schema}.job AS f
               WHERE f.queue = j.queue AND f.ordering_key = j.ordering_key
                 AND f.status = 'failed'
               ORDER BY f.ordering_seq, f.job_id
               LIMIT 1) AS f
           WHERE (f.ordering_seq, f.job_id) < (j.ordering_seq, j.job_id))
       END
FROM {schema}.job AS j
WHERE j.job_id = %(job_id)s
