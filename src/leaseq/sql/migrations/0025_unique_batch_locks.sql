-- leaseq migration 0025: a unique batch of any size enqueues; before, one of
-- more keys than the server's lock table holds failed.
--
-- Producers of a unique key take turns on a transaction-level advisory lock of
-- the key (0007), and a batch took one per key, held to its commit. Advisory
-- locks live in the server's one shared lock table, sized for
-- max_locks_per_transaction x max_connections (6,400 locks by default) for
-- every session together: a batch of ~20,000 keys failed with "out of shared
-- memory" (a TransientError no retry mends), and while a big batch held its
-- locks other sessions' locks (a claim's, a migration's) could fail the same way.
--
-- Now every producer of a queue's unique keys (an enqueue, a batch, a replay)
-- also takes the queue's unique lock: shared, so producers of different keys
-- never wait for each other, and then its keys' locks as before. A batch of
-- more than 500 keys instead takes the queue's lock alone, exclusive: it holds
-- one lock however many keys it has, and waits for (then holds back) every other
-- producer of the queue's unique keys until it commits. Within one statement
-- the queue's lock is always taken before any key's, so the two never deadlock.
CREATE FUNCTION {schema}.unique_queue_lock_class() RETURNS integer
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$ SELECT hashtext('leaseq.unique-queue:{schema}.') $$;

-- The turn of a batch's keys, in one call (plpgsql: the locks are taken in
-- this order whatever plan the calling statement gets): the queue's lock, then
-- the keys' in key order (as batches of leaseq before 0025 take them, so
-- that two batches that share keys never deadlock on each other during a
-- rolling upgrade either); or, past 500 keys, the queue's lock alone, exclusive.
CREATE FUNCTION {schema}.unique_take_turns(p_queue text, p_keys text[]) RETURNS void
    LANGUAGE plpgsql
    AS $$
DECLARE
    key text;
BEGIN
    IF (SELECT count(DISTINCT k) FROM unnest(p_keys) AS k) > 500 THEN
        PERFORM pg_advisory_xact_lock({schema}.unique_queue_lock_class(), hashtext(p_queue));
        RETURN;
    END IF;
    PERFORM pg_advisory_xact_lock_shared({schema}.unique_queue_lock_class(), hashtext(p_queue));
    FOR key IN SELECT DISTINCT k FROM unnest(p_keys) AS k ORDER BY k LOOP
        PERFORM pg_advisory_xact_lock({schema}.unique_lock_class(),
                                      hashtext(p_queue || E'\x1f' || key));
    END LOOP;
END
$$;

-- Enqueue one unique job, its key's turn taken (unique_take_turns): the
-- holder's id (existing) if a job of the queue holds the key, else the new
-- job's id. The rest is 0020's enqueue_unique().
CREATE FUNCTION {schema}.enqueue_unique_in_turn(
    p_queue text, p_channel text, p_payload jsonb, p_payload_bytes integer,
    p_priority smallint, p_available_at timestamptz, p_max_attempts integer,
    p_ordering_key text, p_ordering_seq bigint, p_idempotency_key text,
    p_trace_context jsonb, p_timeout double precision,
    p_unique_key text, p_unique_for double precision, p_group_key text)
    RETURNS TABLE (job_id bigint, existing boolean)
    LANGUAGE plpgsql
    ROWS 1
    AS $$
DECLARE
    holder bigint;
    admitted record;
    inserted bigint;
BEGIN
    holder := {schema}.unique_holder(p_queue, p_unique_key);
    IF holder IS NOT NULL THEN
        RETURN QUERY SELECT holder, true;
        RETURN;
    END IF;
    SELECT * INTO admitted FROM {schema}.admit(p_queue, 1, p_payload_bytes, p_payload_bytes);
    INSERT INTO {schema}.job AS j (
        queue, payload, payload_bytes, priority, available_at, max_attempts,
        ordering_key, ordering_seq, idempotency_key, counted, trace_context,
        timeout_seconds, unique_key, unique_for, unique_held, group_key)
    VALUES (
        p_queue, p_payload, p_payload_bytes, p_priority, p_available_at,
        coalesce(p_max_attempts, admitted.max_attempts),
        p_ordering_key, p_ordering_seq, p_idempotency_key, admitted.counted, p_trace_context,
        p_timeout, p_unique_key, p_unique_for, true, p_group_key)
    ON CONFLICT (queue, unique_key) WHERE unique_held DO NOTHING
    RETURNING j.job_id INTO inserted;
    IF inserted IS NULL THEN
        IF admitted.counted THEN
            UPDATE {schema}.backlog AS b
                SET jobs = b.jobs - 1, bytes = b.bytes - p_payload_bytes
                WHERE b.queue = p_queue AND b.shard = pg_backend_pid() % 16;
        END IF;
        RETURN QUERY SELECT j.job_id, true FROM {schema}.job AS j
            WHERE j.queue = p_queue AND j.unique_key = p_unique_key AND j.unique_held;
        RETURN;
    END IF;
    IF p_channel IS NOT NULL AND admitted.wake THEN
        PERFORM pg_notify(p_channel, p_queue);
    END IF;
    RETURN QUERY SELECT inserted, false;
END
$$;

-- One unique job: its key's turn (the queue's lock shared, then the key's),
-- then the above. Producers of an older leaseq call this one for every row of
-- their batches too, after locking the batch's keys their way.
CREATE OR REPLACE FUNCTION {schema}.enqueue_unique(
    p_queue text, p_channel text, p_payload jsonb, p_payload_bytes integer,
    p_priority smallint, p_available_at timestamptz, p_max_attempts integer,
    p_ordering_key text, p_ordering_seq bigint, p_idempotency_key text,
    p_trace_context jsonb, p_timeout double precision,
    p_unique_key text, p_unique_for double precision, p_group_key text)
    RETURNS TABLE (job_id bigint, existing boolean)
    LANGUAGE plpgsql
    ROWS 1
    AS $$
BEGIN
    PERFORM {schema}.unique_take_turns(p_queue, ARRAY[p_unique_key]);
    RETURN QUERY SELECT * FROM {schema}.enqueue_unique_in_turn(
        p_queue, p_channel, p_payload, p_payload_bytes, p_priority, p_available_at,
        p_max_attempts, p_ordering_key, p_ordering_seq, p_idempotency_key,
        p_trace_context, p_timeout, p_unique_key, p_unique_for, p_group_key);
END
$$;

-- A replay takes its key's turn the same way (the rest is 0010's).
CREATE OR REPLACE FUNCTION {schema}.unique_follow_status() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
DECLARE
    holder bigint;
BEGIN
    IF (OLD.status IN ('queued', 'running')) = (NEW.status IN ('queued', 'running')) THEN
        RETURN NEW;
    END IF;
    IF NEW.status IN ('queued', 'running') THEN
        PERFORM {schema}.unique_take_turns(NEW.queue, ARRAY[NEW.unique_key]);
        holder := {schema}.unique_holder(NEW.queue, NEW.unique_key);
        IF holder IS NOT NULL AND holder <> NEW.job_id THEN
            RAISE EXCEPTION 'unique key % of queue % is held by job %',
                NEW.unique_key, NEW.queue, holder
                USING ERRCODE = 'LQ003';
        END IF;
        NEW.unique_held := true;
    ELSE
        NEW.unique_held := NEW.status = 'done' AND coalesce(NEW.unique_for, 0) > 0;
    END IF;
    RETURN NEW;
END
$$;
