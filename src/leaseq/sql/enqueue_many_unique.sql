-- Enqueue many unique jobs of one queue: per input position, the job's id and
-- whether it already existed (a job of the queue held its key, an earlier row
-- of this batch included). The batch first takes its keys' turn
-- (unique_take_turns(), migration 0025: the queue's lock shared and every key's
-- lock in key order, so two batches that share keys never deadlock on each
-- other; past 500 keys the queue's lock alone, exclusive, so that a batch holds
-- a bounded number of the server's locks); then one enqueue_unique_in_turn()
-- per row in input order, so the jobs get their ids, and run, in the order they
-- were given.
WITH input AS (
    SELECT *
    FROM unnest(%(payloads)b::text[], %(payload_bytes)b::integer[], %(seqs)b::bigint[],
                %(unique_keys)s::text[])
        WITH ORDINALITY AS i (payload, payload_bytes, seq, unique_key, position)
),
locked AS MATERIALIZED (
    SELECT {schema}.unique_take_turns(%(queue)s, %(unique_keys)s::text[]) AS turn
),
-- The rows the batch will insert, its turn taken: the first row of each key
-- that no job holds.
fresh AS MATERIALIZED (
    SELECT count(*) AS jobs, coalesce(sum(k.payload_bytes), 0) AS bytes,
           coalesce(max(k.payload_bytes), 0) AS largest
    -- (locked inside the sorted subquery, so that every holder is looked for
    -- after the turn is taken, whatever the plan: joined beside it, the first
    -- key's look may come before the locks)
    FROM (SELECT DISTINCT ON (unique_key) unique_key, payload_bytes
          FROM input CROSS JOIN locked ORDER BY unique_key, position) AS k
    WHERE {schema}.unique_holder(%(queue)s, k.unique_key) IS NULL
),
-- The batch's admission, checked whole before any row: each
-- enqueue_unique_in_turn() below admits its own row again, and one refused
-- there counted the rows of the batch before it, which the refusal rolls back,
-- as queued ("5 unfinished jobs" with one queued). admit() counts what it
-- admits: the second call takes the batch's count back out (the same shard of
-- the counter, in this same transaction), so that only the rows' own
-- admissions remain.
admitted AS MATERIALIZED (
    SELECT f.jobs, f.bytes
    FROM (SELECT * FROM fresh WHERE fresh.jobs > 0) AS f  -- (duplicates only: nothing
    --  to admit, even past a limit lowered below what is queued)
    CROSS JOIN LATERAL {schema}.admit(%(queue)s, f.jobs, f.bytes, f.largest) AS a
),
checked AS MATERIALIZED (
    SELECT count(*) AS checks
    FROM admitted  -- (scanned, so admitted, before the count goes back out)
    CROSS JOIN LATERAL {schema}.admit(%(queue)s, -admitted.jobs, -admitted.bytes, 0) AS back
),
ordered AS MATERIALIZED (
    SELECT i.* FROM input AS i CROSS JOIN locked CROSS JOIN checked ORDER BY i.position
)
SELECT i.position, u.job_id, u.existing
FROM ordered AS i
CROSS JOIN LATERAL {schema}.enqueue_unique_in_turn(
    %(queue)s, %(channel)s::text, i.payload::jsonb, i.payload_bytes,
    %(priority)s::smallint,
    coalesce(%(run_at)s::timestamptz,
             {schema}.clock() + make_interval(secs => coalesce(%(delay)s::double precision, 0))),
    %(max_attempts)s::integer, %(key)s::text, i.seq, NULL::text,
    %(trace_context)s::jsonb, %(timeout)s::double precision,
    i.unique_key, %(unique_for)s::double precision, %(group)s::text) AS u
