-- leaseq migration 0010: less work that PostgreSQL repeats in every statement
-- that writes a job.
--
-- PostgreSQL keeps a table's CHECK constraints and its triggers' WHEN clauses
-- as serialized expression trees. Every INSERT or UPDATE statement reads the
-- CHECKs back from text and plans them again, and every UPDATE OF status does
-- the same for the WHEN clause of each trigger on that column, even when the
-- statement writes one row. Before this migration, that work was about 7.7 kB
-- of CHECK text and 9 kB of WHEN text. Measured on PostgreSQL 15 with perf, it
-- took 26 % of the server's time for a one-job enqueue, and about 140 µs of
-- each one-row claim or completion. bench/README.md has the numbers.
--
-- 1. The checks on values that the client validates before anything is
--    written are dropped: key lengths, max_attempts, timeout, unique_for,
--    payload_bytes and attempts. leaseq._validate checks them first and
--    raises InvalidJob, so they cost every statement and caught nothing. The
--    checks on the state machine's own invariants stay: the statuses, a lease
--    exactly when running, key and sequence together, and a held unique key.
-- 2. The WHEN clause of each trigger on status now tests one column (the job
--    is ordered, counted, unique or limited); the test of the transition
--    moved into the function. A job without these features still never calls
--    any of these functions. A job with them may call one and return at the
--    first line, which costs a few µs per row, only for those jobs.
--
-- Nothing here scans or rewrites the job table.

ALTER TABLE {schema}.job
    DROP CONSTRAINT job_attempts_check,
    DROP CONSTRAINT job_max_attempts_check,
    DROP CONSTRAINT job_payload_bytes_check,
    DROP CONSTRAINT job_timeout_seconds_check,
    DROP CONSTRAINT job_unique_for_check,
    DROP CONSTRAINT job_ordering_key_check,
    DROP CONSTRAINT job_idempotency_key_check,
    DROP CONSTRAINT job_unique_key_check,
    DROP CONSTRAINT job_group_key_check;

-- Counted jobs: a change of status counts only when it crosses unfinished
-- (queued or running) to finished, or back.
CREATE OR REPLACE FUNCTION {schema}.count_backlog() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
DECLARE
    sign integer := CASE WHEN NEW.status IN ('queued', 'running') THEN 1 ELSE -1 END;
BEGIN
    IF (OLD.status IN ('queued', 'running')) = (NEW.status IN ('queued', 'running')) THEN
        RETURN NULL;
    END IF;
    INSERT INTO {schema}.backlog AS b (queue, shard, jobs, bytes)
        VALUES (NEW.queue, 16 + pg_backend_pid() % 16, sign, sign * NEW.payload_bytes)
        ON CONFLICT (queue, shard)
        DO UPDATE SET jobs = b.jobs + excluded.jobs, bytes = b.bytes + excluded.bytes;
    RETURN NULL;
END
$$;

DROP TRIGGER job_backlog_count ON {schema}.job;
CREATE TRIGGER job_backlog_count
    AFTER UPDATE OF status ON {schema}.job
    FOR EACH ROW
    WHEN (NEW.counted)
    EXECUTE FUNCTION {schema}.count_backlog();

-- Ordered jobs. An update joins the key only as a replay: back to queued from
-- failed or cancelled. (The insert trigger keeps its own WHEN clause, which
-- holds the blocked rows of an enqueue_many out of this function.)
CREATE OR REPLACE FUNCTION {schema}.job_key_enter() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    IF TG_OP = 'UPDATE'
       AND NOT (NEW.status = 'queued' AND OLD.status IN ('failed', 'cancelled')) THEN
        RETURN NEW;
    END IF;
    PERFORM pg_advisory_xact_lock_shared({schema}.key_lock_class(),
                                         {schema}.key_bucket(NEW.queue, NEW.ordering_key));
    -- The key's claimable jobs that come after this one wait behind it (rows
    -- someone else is changing right now are theirs to settle).
    UPDATE {schema}.job AS j SET blocked = true
    FROM (
        SELECT o.job_id FROM {schema}.job AS o
        WHERE o.queue = NEW.queue AND o.ordering_key = NEW.ordering_key
          AND o.status = 'queued' AND NOT o.blocked AND o.job_id <> NEW.job_id
          AND (o.ordering_seq, o.job_id) > (NEW.ordering_seq, NEW.job_id)
        FOR UPDATE SKIP LOCKED
    ) AS later
    WHERE j.job_id = later.job_id;
    -- LIMIT 1 probes of one index each, so no plan can turn them into scans.
    NEW.blocked := (
            SELECT r.job_id FROM {schema}.job AS r
            WHERE r.queue = NEW.queue AND r.ordering_key = NEW.ordering_key
              AND r.status = 'running' AND r.job_id <> NEW.job_id
            LIMIT 1) IS NOT NULL
        OR (SELECT e.job_id FROM {schema}.job AS e
            WHERE e.queue = NEW.queue AND e.ordering_key = NEW.ordering_key
              AND e.status IN ('queued', 'running') AND e.job_id <> NEW.job_id
              AND (e.ordering_seq, e.job_id) < (NEW.ordering_seq, NEW.job_id)
            ORDER BY e.ordering_seq, e.job_id
            LIMIT 1) IS NOT NULL
        OR (coalesce((SELECT q.ordering_policy = 'block' FROM {schema}.queue AS q
                      WHERE q.name = NEW.queue), true)
            AND (SELECT f.job_id FROM {schema}.job AS f
                 WHERE f.queue = NEW.queue AND f.ordering_key = NEW.ordering_key
                   AND f.status = 'failed' AND f.job_id <> NEW.job_id
                   AND (f.ordering_seq, f.job_id) < (NEW.ordering_seq, NEW.job_id)
                 ORDER BY f.ordering_seq, f.job_id
                 LIMIT 1) IS NOT NULL);
    IF NEW.blocked AND current_setting('transaction_isolation') <> 'read committed' THEN
        -- A transaction snapshot may predate the commit that freed the key.
        INSERT INTO {schema}.key_repair (queue, ordering_key, next_check)
            VALUES (NEW.queue, NEW.ordering_key, {schema}.clock());
    END IF;
    RETURN NEW;
END
$$;

DROP TRIGGER job_key_enter_replay ON {schema}.job;
CREATE TRIGGER job_key_enter_replay
    BEFORE UPDATE OF status ON {schema}.job
    FOR EACH ROW
    WHEN (NEW.ordering_key IS NOT NULL)
    EXECUTE FUNCTION {schema}.job_key_enter();

-- An update moves the key on when the job stops running, leaves the queue
-- unfinished (cancelled, reaped) or, failed, is skipped. (The delete trigger
-- keeps its own WHEN clause: deletes are not this file's concern.)
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
    IF NOT pg_try_advisory_xact_lock({schema}.key_lock_class(),
                                     {schema}.key_bucket(OLD.queue, OLD.ordering_key)) THEN
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

DROP TRIGGER job_key_leave_update ON {schema}.job;
CREATE TRIGGER job_key_leave_update
    AFTER UPDATE OF status ON {schema}.job
    FOR EACH ROW
    WHEN (OLD.ordering_key IS NOT NULL)
    EXECUTE FUNCTION {schema}.job_key_leave();

-- Unique jobs: only a change across unfinished and finished moves the hold.
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
        PERFORM pg_advisory_xact_lock({schema}.unique_lock_class(),
                                      hashtext(NEW.queue || E'\x1f' || NEW.unique_key));
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

DROP TRIGGER job_unique_follow_status ON {schema}.job;
CREATE TRIGGER job_unique_follow_status
    BEFORE UPDATE OF status ON {schema}.job
    FOR EACH ROW
    WHEN (NEW.unique_key IS NOT NULL)
    EXECUTE FUNCTION {schema}.unique_follow_status();

-- Jobs claimed under a concurrency limit: the slot is free when the job stops
-- running.
CREATE OR REPLACE FUNCTION {schema}.slot_freed() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    IF OLD.status = 'running' AND NEW.status <> 'running' THEN
        PERFORM pg_notify({schema}.work_channel(TG_TABLE_SCHEMA), NEW.queue);
    END IF;
    RETURN NULL;
END
$$;

DROP TRIGGER job_slot_freed ON {schema}.job;
CREATE TRIGGER job_slot_freed
    AFTER UPDATE OF status ON {schema}.job
    FOR EACH ROW
    WHEN (OLD.limited)
    EXECUTE FUNCTION {schema}.slot_freed();
