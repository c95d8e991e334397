-- Enqueue the job of one tick, with the tick's row, in one statement: the
-- tick's primary key (schedule, tick_at) refuses a second job for it. The job
-- id is drawn first so that the tick row names its job. Admission applies as
-- to any enqueue (a full queue raises LQ001 and writes nothing).
WITH reserved AS (
    SELECT nextval(pg_get_serial_sequence('{schema}.job', 'job_id')) AS job_id
),
tick AS (
    INSERT INTO {schema}.schedule_tick (schedule, tick_at, job_id)
    SELECT %(name)s, %(tick_at)s, r.job_id FROM reserved AS r
    ON CONFLICT (schedule, tick_at) DO NOTHING
    RETURNING job_id
),
notified AS (
    SELECT pg_notify(%(channel)s, %(queue)s) WHERE %(channel)s::text IS NOT NULL
)
INSERT INTO {schema}.job (
    job_id, queue, payload, payload_bytes, priority, available_at, max_attempts,
    idempotency_key, counted
)
OVERRIDING SYSTEM VALUE
SELECT tick.job_id, %(queue)s, %(payload)s::jsonb, %(payload_bytes)s, %(priority)s,
       {schema}.clock(), coalesce(%(max_attempts)s::integer, a.max_attempts),
       %(idempotency_key)s, a.counted
FROM tick
CROSS JOIN LATERAL {schema}.admit(%(queue)s, 1, %(payload_bytes)s, %(payload_bytes)s) AS a
LEFT JOIN notified ON true
RETURNING job_id
