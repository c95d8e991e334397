-- Enqueue many jobs of one queue in one statement; ids come back in input order.
WITH admitted AS (
    SELECT * FROM {schema}.admit(
        %(queue)s, %(count)s, %(total_bytes)s, %(largest_bytes)s)
),
-- A wake-up hint for idle workers (NULL channel: none). PostgreSQL folds equal
-- notifications of one transaction into one, and delivers them at commit.
notified AS (
    SELECT pg_notify(%(channel)s, %(queue)s) WHERE %(channel)s::text IS NOT NULL
),
input AS (
    SELECT *
    FROM unnest(%(payloads)s::text[], %(payload_bytes)s::integer[], %(seqs)s::bigint[])
        WITH ORDINALITY AS i (payload, payload_bytes, seq, position)
)
INSERT INTO {schema}.job (
    queue, payload, payload_bytes, priority, available_at, max_attempts,
    ordering_key, ordering_seq, counted
)
SELECT
    %(queue)s,
    input.payload::jsonb,
    input.payload_bytes,
    %(priority)s,
    coalesce(%(run_at)s::timestamptz,
             {schema}.clock() + make_interval(secs => coalesce(%(delay)s::double precision, 0))),
    coalesce(%(max_attempts)s::integer, admitted.max_attempts),
    %(key)s::text,
    input.seq,
    admitted.counted
FROM admitted LEFT JOIN notified ON true, input
ORDER BY input.position
RETURNING job_id
