-- leaseq migration 0023: a payload larger than its queue's whole byte limit is
-- refused as too large (LQ002, PayloadTooLarge), not as a full queue.
--
-- admit() told such a payload "queue full" (LQ001, BacklogFull), which means
-- "try later": however much the queue drained, it could never fit, and a
-- producer retrying on BacklogFull spun for ever. The limit is read here, on
-- the row the admission reads anyway, so the refusal costs one comparison and
-- is right whatever the limit is changed to meanwhile. (A batch whose largest
-- payload fits but whose total does not is still BacklogFull: split, it fits.)
-- The rest is 0020's.
CREATE OR REPLACE FUNCTION {schema}.admit(p_queue text, p_jobs bigint, p_bytes bigint,
                                          p_largest bigint)
    RETURNS TABLE (max_attempts integer, counted boolean, wake boolean)
    LANGUAGE plpgsql
    ROWS 1
    AS $$
DECLARE
    settings {schema}.queue;
    backlog_jobs bigint;
    backlog_bytes bigint;
BEGIN
    PERFORM pg_current_xact_id();  -- the id first, then the read (0020)
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
    IF settings.max_queued_bytes IS NOT NULL AND p_largest > settings.max_queued_bytes THEN
        RAISE EXCEPTION 'payload of % bytes can never fit queue %: larger than its whole '
            'max_queued_bytes of % bytes', p_largest, p_queue, settings.max_queued_bytes
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
