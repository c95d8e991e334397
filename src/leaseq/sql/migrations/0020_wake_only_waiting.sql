-- leaseq migration 0020: an enqueue sends its wake-up NOTIFY only while some
-- worker waits for one on the job's queue.
--
-- PostgreSQL takes one lock for every notifying commit and holds it through
-- the commit's WAL flush: with 16 producers committing at once, notifying
-- cost 43 % of their enqueues (bench/README.md, 2026-12-05). A notification
-- only matters to a worker that waits for one: one that is busy claims again
-- as its slots free up, and none at all reads it later.
--
-- A worker that found less to claim on a queue than it could take enters
-- itself in the queue's row (`waiting`: worker -> when the entry expires, in
-- epoch seconds) before it waits, and leaves once its claims of the queue
-- come back full for a while. admit(), which every enqueue already calls and
-- which already reads the queue's row, now also says whether to notify.
--
-- No wake-up is lost in between. admit() gives its transaction an id before
-- it reads the row, on a snapshot of its own (READ COMMITTED: each statement
-- of a volatile function takes a fresh one). So a producer that read "nobody
-- waits" had its id before the worker's entry committed. The worker, once
-- its entry committed, takes a transaction id of its own (the fence: every
-- id below it was given before) and claims again until no transaction below
-- the fence runs (pg_snapshot_xmin of a fresh snapshot reaches it): by then
-- every such producer has committed, and that claim sees its jobs. A
-- producer in a transaction that reads one snapshot (REPEATABLE READ,
-- SERIALIZABLE) could not see an entry made after it began: it always
-- notifies.
--
-- A table of entries of its own cost every enqueue ~20 us more on the server
-- (a query, its relation locks past the fast-path slots the job table's
-- indexes use up); the queue's row costs nothing more to read.
ALTER TABLE {schema}.queue ADD COLUMN waiting jsonb NOT NULL DEFAULT '{}';

-- Workers of an older leaseq wait for notifications without entering: on the
-- queues already in use, every enqueue notifies for a day (the time a rolling
-- upgrade has to replace them), until the reaper's round drops this entry.
UPDATE {schema}.queue
SET waiting = jsonb_build_object('workers of leaseq before migration 20',
                                 extract(epoch FROM statement_timestamp() + interval '1 day'));

-- As in 0001, with the wake-up's answer (wake) and the transaction's id first.
DROP FUNCTION {schema}.admit(text, bigint, bigint, bigint);
CREATE FUNCTION {schema}.admit(p_queue text, p_jobs bigint, p_bytes bigint, p_largest bigint)
    RETURNS TABLE (max_attempts integer, counted boolean, wake boolean)
    LANGUAGE plpgsql
    ROWS 1
    AS $$
DECLARE
    settings {schema}.queue;
    backlog_jobs bigint;
    backlog_bytes bigint;
BEGIN
    PERFORM pg_current_xact_id();  -- the id first, then the read (see above)
    SELECT * INTO settings FROM {schema}.queue AS q WHERE q.name = p_queue;
    IF NOT FOUND THEN
        INSERT INTO {schema}.queue AS q (name) VALUES (p_queue)
            ON CONFLICT (name) DO NOTHING;
        SELECT * INTO settings FROM {schema}.queue AS q WHERE q.name = p_queue;
    END IF;
    IF settings.max_payload_bytes IS NOT NULL AND p_largest > settings.max_payload_bytes THEN
        RAISE EXCEPTION 'payload of % bytes exceeds the limit of % bytes for queue %',
            p_largest, settings.max_payload_bytes, p_queue
            USING ERRCODE = 'LQ002';
    END IF;
    IF settings.counts_backlog THEN
        SELECT coalesce(sum(b.jobs), 0), coalesce(sum(b.bytes), 0)
            INTO backlog_jobs, backlog_bytes
            FROM {schema}.backlog AS b WHERE b.queue = p_queue;
        IF backlog_jobs + p_jobs > settings.max_queued_jobs THEN
            RAISE EXCEPTION 'queue % is full: % unfinished jobs, limit %',
                p_queue, backlog_jobs, settings.max_queued_jobs
                USING ERRCODE = 'LQ001';
        END IF;
        IF backlog_bytes + p_bytes > settings.max_queued_bytes THEN
            RAISE EXCEPTION 'queue % is full: % unfinished bytes, limit %',
                p_queue, backlog_bytes, settings.max_queued_bytes
                USING ERRCODE = 'LQ001';
        END IF;
        INSERT INTO {schema}.backlog AS b (queue, shard, jobs, bytes)
            VALUES (p_queue, pg_backend_pid() % 16, p_jobs, p_bytes)
            ON CONFLICT (queue, shard)
            DO UPDATE SET jobs = b.jobs + excluded.jobs, bytes = b.bytes + excluded.bytes;
    END IF;
    RETURN QUERY SELECT settings.max_attempts, settings.counts_backlog,
        settings.waiting <> '{}'::jsonb
        OR current_setting('transaction_isolation') <> 'read committed';
END
$$;

-- As in 0009, notifying only when admit() says a worker waits.
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
DECLARE
    holder bigint;
    admitted record;
    inserted bigint;
BEGIN
    PERFORM pg_advisory_xact_lock({schema}.unique_lock_class(),
                                  hashtext(p_queue || E'\x1f' || p_unique_key));
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
