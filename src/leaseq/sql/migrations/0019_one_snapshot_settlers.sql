-- leaseq migration 0019: a key moved on in a transaction that reads one
-- snapshot (REPEATABLE READ, SERIALIZABLE) is settled again later.
--
-- A completion, retry or failure inside a caller's transaction (the handler's
-- effect and its fenced write in one transaction) settles the job's key on
-- that transaction's snapshot, not on a fresh one: a job of the key committed
-- after the snapshot was taken (a producer's, blocked behind the running job)
-- was not seen, so nothing made it the key's head. The bucket's lock, free by
-- then, left no repair note either, and the key stayed stuck for ever.
--
-- Now such a settling always leaves a note, as a producer in such a
-- transaction does for a job it blocked (0002): the next claim of the queue
-- settles the key again on a fresh snapshot. Otherwise as in 0014.
CREATE OR REPLACE FUNCTION {schema}.job_key_leave() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    IF TG_OP = 'UPDATE' AND NOT (
           (OLD.status = 'running' AND NEW.status <> 'running')
        OR (OLD.status = 'queued' AND NEW.status NOT IN ('queued', 'running'))
        OR (OLD.status = 'failed' AND NEW.status = 'cancelled')) THEN
        RETURN NULL;
    END IF;
    -- A running job cut short, its lease live: cancelled (its handler runs
    -- until told), or released while its handler runs on (requeued for when
    -- the lease would have ended). No job of the key may start before then.
    IF TG_OP = 'UPDATE' AND OLD.status = 'running' AND OLD.lease_until > {schema}.clock()
       AND (NEW.status = 'cancelled'
            OR (NEW.status = 'queued' AND NEW.available_at > {schema}.clock()
                AND NEW.history -> -1 ->> 'write' = 'release')) THEN
        INSERT INTO {schema}.key_hold AS h (queue, ordering_key, until)
        VALUES (OLD.queue, OLD.ordering_key,
                CASE WHEN NEW.status = 'cancelled' THEN OLD.lease_until ELSE NEW.available_at END)
        ON CONFLICT (queue, ordering_key) DO UPDATE SET until = greatest(h.until, excluded.until);
    END IF;
    -- (A transaction snapshot may predate jobs of the key committed since,
    -- whichever producer is in flight now.)
    IF NOT pg_try_advisory_xact_lock({schema}.key_lock_class(),
                                     {schema}.key_bucket(OLD.queue, OLD.ordering_key))
       OR current_setting('transaction_isolation') <> 'read committed' THEN
        INSERT INTO {schema}.key_repair (queue, ordering_key, next_check)
            VALUES (OLD.queue, OLD.ordering_key, {schema}.clock());
    END IF;
    PERFORM set_config('leaseq.keys_to_settle',
        coalesce(current_setting('leaseq.keys_to_settle', true), '')
            || ',' || jsonb_build_array(OLD.queue, OLD.ordering_key)::text,
        true);
    RETURN NULL;
END
$$;
