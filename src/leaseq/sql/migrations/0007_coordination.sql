-- leaseq migration 0007: per-job timeouts, job results and unique jobs.
--
-- Every column is nullable or has a constant default: adding them rewrites
-- nothing, on a table of any size. job_archive gets the same columns (it has
-- every column of job).

-- The handler's time limit for this job, overriding its task's (NULL: the task's).
ALTER TABLE {schema}.job ADD COLUMN timeout_seconds double precision
    CHECK (timeout_seconds > 0);
ALTER TABLE {schema}.job_archive ADD COLUMN timeout_seconds double precision;

-- What the handler returned (JSON), written by the fenced completion itself;
-- NULL when it returned None. Removed with the job by retention.
ALTER TABLE {schema}.job ADD COLUMN result jsonb;
ALTER TABLE {schema}.job_archive ADD COLUMN result jsonb;
-- Someone waits for this job's end (wait_result sets it): its completion or
-- failure then notifies the results channel. Jobs nobody waits for notify
-- nothing, so their commits never queue for the server's notification lock.
ALTER TABLE {schema}.job ADD COLUMN result_awaited boolean NOT NULL DEFAULT false;
ALTER TABLE {schema}.job_archive ADD COLUMN result_awaited boolean NOT NULL DEFAULT false;

-- Unique jobs. unique_key is the producer's key, kept for as long as the row;
-- unique_held says whether this job holds it: from its enqueue while it is
-- unfinished, then, once done, for unique_for seconds more. At most one job of
-- a queue holds a key: the unique index below is the arbiter, so no race
-- between producers can insert two.
ALTER TABLE {schema}.job
    ADD COLUMN unique_key text CHECK (octet_length(unique_key) <= 255),
    ADD COLUMN unique_for double precision CHECK (unique_for >= 0),
    ADD COLUMN unique_held boolean NOT NULL DEFAULT false,
    ADD CHECK (NOT unique_held OR unique_key IS NOT NULL);
ALTER TABLE {schema}.job_archive
    ADD COLUMN unique_key text,
    ADD COLUMN unique_for double precision,
    ADD COLUMN unique_held boolean NOT NULL DEFAULT false;

CREATE UNIQUE INDEX job_unique_idx ON {schema}.job (queue, unique_key) WHERE unique_held;

-- Producers of one unique key take turns (a transaction-level advisory lock,
-- held until the producer commits or rolls back): the next one looks for the
-- holder only once the last one's insert is committed or gone, on a fresh
-- snapshot. So it finds the holder instead of colliding with it in the index,
-- and no side effect of an insert that would then be skipped (an ordering
-- key's triggers) ever runs. 2^32 locks per schema; a collision only costs a wait.
CREATE FUNCTION {schema}.unique_lock_class() RETURNS integer
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$ SELECT hashtext('leaseq.unique:{schema}.') $$;

-- The job of p_queue that holds p_key now, if any, after releasing a done
-- job's hold whose unique_for has passed (holds lapse lazily, when looked at).
-- The caller holds the key's advisory lock.
CREATE FUNCTION {schema}.unique_holder(p_queue text, p_key text) RETURNS bigint
    LANGUAGE plpgsql
    AS $$
DECLARE
    holder {schema}.job;
BEGIN
    SELECT * INTO holder FROM {schema}.job AS j
        WHERE j.queue = p_queue AND j.unique_key = p_key AND j.unique_held;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    IF holder.status = 'done'
       AND holder.finished_at + make_interval(secs => holder.unique_for) <= {schema}.clock() THEN
        UPDATE {schema}.job AS j SET unique_held = false
            WHERE j.job_id = holder.job_id AND j.unique_held;
        RETURN NULL;
    END IF;
    RETURN holder.job_id;
END
$$;

-- Enqueue one unique job: the holder's id (existing) if a job of the queue
-- holds the key, else the new job's id. plpgsql, so that under READ COMMITTED
-- the look for the holder, taken after the key's lock, sees the previous
-- producer's commit. The insert's ON CONFLICT is the arbiter all the same:
-- should it meet a holder (a replay that took the key meanwhile), the job is
-- not inserted, its admission is counted back, and the holder is returned.
-- Under REPEATABLE READ a holder committed after the caller's snapshot is
-- invisible to it: the server then raises a serialization failure (retry the
-- transaction), never a second job of the key.
CREATE FUNCTION {schema}.enqueue_unique(
    p_queue text, p_channel text, p_payload jsonb, p_payload_bytes integer,
    p_priority smallint, p_available_at timestamptz, p_max_attempts integer,
    p_ordering_key text, p_ordering_seq bigint, p_idempotency_key text,
    p_trace_context jsonb, p_timeout double precision,
    p_unique_key text, p_unique_for double precision)
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
        timeout_seconds, unique_key, unique_for, unique_held)
    VALUES (
        p_queue, p_payload, p_payload_bytes, p_priority, p_available_at,
        coalesce(p_max_attempts, admitted.max_attempts),
        p_ordering_key, p_ordering_seq, p_idempotency_key, admitted.counted, p_trace_context,
        p_timeout, p_unique_key, p_unique_for, true)
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
    IF p_channel IS NOT NULL THEN
        PERFORM pg_notify(p_channel, p_queue);
    END IF;
    RETURN QUERY SELECT inserted, false;
END
$$;

-- A unique job follows its status: finishing releases its hold (a done job
-- with unique_for keeps it that long, see unique_holder); a replay (back to
-- queued) takes it again, and refuses with LQ003 while another job holds it.
-- The WHEN clause runs in C: jobs without a unique key never call this.
CREATE FUNCTION {schema}.unique_follow_status() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
DECLARE
    holder bigint;
BEGIN
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

CREATE TRIGGER job_unique_follow_status
    BEFORE UPDATE OF status ON {schema}.job
    FOR EACH ROW
    WHEN (NEW.unique_key IS NOT NULL
          AND (OLD.status IN ('queued', 'running')) <> (NEW.status IN ('queued', 'running')))
    EXECUTE FUNCTION {schema}.unique_follow_status();
