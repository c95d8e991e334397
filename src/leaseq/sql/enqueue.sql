-- Enqueue one job; admit() checks the queue's limits first and raises
-- LQ001/LQ002 instead of writing anything.
WITH admitted AS (
    SELECT * FROM {schema}.admit(%(queue)s, 1, %(payload_bytes)s, %(payload_bytes)s)
),
-- A wake-up hint for idle workers (NULL channel: none), sent only while one
-- waits for it (admitted.wake, migration 0020). PostgreSQL folds equal
-- notifications of one transaction into one, and delivers them at commit.
notified AS (
    SELECT pg_notify(%(channel)s, %(queue)s)
    FROM admitted
    WHERE %(channel)s::text IS NOT NULL AND admitted.wake
)
INSERT INTO {schema}.job (
    queue, payload, payload_bytes, priority, available_at, max_attempts,
    ordering_key, ordering_seq, idempotency_key, counted, trace_context, timeout_seconds, group_key
)
SELECT
    %(queue)s,
    %(payload)s::jsonb,
    %(payload_bytes)s,
    %(priority)s,
    coalesce(%(run_at)s::timestamptz,
             {schema}.clock() + make_interval(secs => coalesce(%(delay)s::double precision, 0))),
    coalesce(%(max_attempts)s::integer, admitted.max_attempts),
    %(key)s::text,
    %(seq)s::bigint,
    %(idempotency_key)s::text,
    admitted.counted,
    %(trace_context)s::jsonb,
    %(timeout)s::double precision,
    %(group)s::text
FROM admitted LEFT JOIN notified ON true
RETURNING job_id
