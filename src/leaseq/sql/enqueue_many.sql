-- Enqueue many jobs of one queue in one statement; ids come back in input order.
WITH admitted AS (
    SELECT * FROM {schema}.admit(
        %(queue)s, %(count)s, %(total_bytes)s, %(largest_bytes)s)
),
-- A wake-up hint for idle workers (NULL channel: none), sent only while one
-- waits for it (admitted.wake, migration 0020). PostgreSQL folds equal
-- notifications of one transaction into one, and delivers them at commit.
notified AS (
    SELECT pg_notify(%(channel)s, %(queue)s)
    FROM admitted
    WHERE %(channel)s::text IS NOT NULL AND admitted.wake
),
-- The arrays go in binary (%(...)b): the driver's text form quotes every
-- element with a regular expression, most of a batch's client time.
input AS (
    SELECT *
    FROM unnest(%(payloads)b::text[], %(payload_bytes)b::integer[], %(seqs)b::bigint[])
        WITH ORDINALITY AS i (payload, payload_bytes, seq, position)
),
-- With an ordering key, only the batch's earliest job can be its key's head:
-- the others wait behind it from the start (and skip job_key_enter).
ordered AS (
    SELECT input.*,
           %(key)s::text IS NOT NULL
               AND row_number() OVER (ORDER BY input.seq, input.position) > 1 AS blocked
    FROM input
)
INSERT INTO {schema}.job (
    queue, payload, payload_bytes, priority, available_at, max_attempts,
    ordering_key, ordering_seq, blocked, counted, trace_context, timeout_seconds, group_key
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
    input.blocked,
    admitted.counted,
    %(trace_context)s::jsonb,
    %(timeout)s::double precision,
    %(group)s::text
FROM admitted LEFT JOIN notified ON true, ordered AS input
ORDER BY input.position
RETURNING job_id
