-- Enqueue one unique job (enqueue_unique(), migrations 0007 and 0025): the
-- holder's id and existing = true if a job of the queue holds the key, else
-- the new job's id. It notifies only while a worker waits (migration 0020).
SELECT u.job_id, u.existing
FROM {schema}.enqueue_unique(
    %(queue)s, %(channel)s::text, %(payload)s::jsonb, %(payload_bytes)s::integer,
    %(priority)s::smallint,
    coalesce(%(run_at)s::timestamptz,
             {schema}.clock() + make_interval(secs => coalesce(%(delay)s::double precision, 0))),
    %(max_attempts)s::integer, %(key)s::text, %(seq)s::bigint, %(idempotency_key)s::text,
    %(trace_context)s::jsonb, %(timeout)s::double precision,
    %(unique_key)s::text, %(unique_for)s::double precision, %(group)s::text) AS u
