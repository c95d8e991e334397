-- leaseq migration 0023: a lease cut short holds its concurrency slot also when
-- its job was claimed without a limit.
--
-- A running job cut short (cancelled while running, or released while its
-- handler runs on) may still run until its lease would have ended: 0015 holds
-- its slot until then (slot_hold), but only for a job claimed under a
-- concurrency limit (`limited`), the rows job_slot_freed fired for. A job
-- claimed without one (its queue had no limit yet, or its claim raced the
-- setting of one) held nothing, so a limit set after the cut counted no
-- handler of it: `configure_queue(max_running=1)` right after a cancel started
-- the next job beside the handler still running.
--
-- Now the trigger fires for such cuts too, whatever the job's mark, and writes
-- their hold; the holds of a queue without limits are read by no claim, and
-- the reaper drops them once ended, as any. The end of a `limited` job is still
-- the one announced. A cut is rare (an operator's cancel, a worker's stop), and
-- the trigger's WHEN lets through, besides those, only the other cancels and
-- the retries whose next attempt waits past the old lease's end. Cuts made
-- before this migration of jobs claimed without a limit keep holding nothing:
-- a window of one lease.

CREATE OR REPLACE FUNCTION {schema}.slot_freed() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    IF OLD.status = 'running' AND NEW.status <> 'running' THEN
        IF OLD.lease_until > {schema}.clock()
           AND (NEW.status = 'cancelled'
                OR (NEW.status = 'queued' AND NEW.available_at > {schema}.clock()
                    AND NEW.history -> -1 ->> 'write' = 'release')) THEN
            INSERT INTO {schema}.slot_hold AS h (job_id, queue, group_key, until)
            VALUES (OLD.job_id, OLD.queue, OLD.group_key,
                    CASE WHEN NEW.status = 'cancelled' THEN OLD.lease_until
                         ELSE NEW.available_at END)
            ON CONFLICT (job_id) DO UPDATE
                SET queue = excluded.queue, group_key = excluded.group_key,
                    until = greatest(h.until, excluded.until);
            RETURN NULL;  -- not free yet: nothing to announce
        END IF;
        IF OLD.limited THEN
            PERFORM pg_notify({schema}.work_channel(TG_TABLE_SCHEMA), NEW.queue);
        END IF;
    END IF;
    RETURN NULL;
END
$$;

-- The jobs claimed under a limit, as before, and the cuts of the others: a
-- cancel, or a write that keeps the job waiting until its lease would have
-- ended (a release whose handler runs on; the function tells a cut from a
-- cancel of a queued job or a retry's backoff). Kept short: PostgreSQL reads
-- this clause back in every statement that writes a job's status
-- (tests/test_statement_cost.py).
DROP TRIGGER job_slot_freed ON {schema}.job;
CREATE TRIGGER job_slot_freed
    AFTER UPDATE OF status ON {schema}.job
    FOR EACH ROW
    WHEN (OLD.limited OR NEW.status = 'cancelled' OR NEW.available_at >= OLD.lease_until)
    EXECUTE FUNCTION {schema}.slot_freed();
