-- leaseq migration 0002: per-key ordering as mutual exclusion, and a claim
-- that never walks a key's waiting jobs.
--
-- Before: every queued job of an ordering key sat in the ready index and the
-- claim filtered out all but the earliest with NOT EXISTS, so a backlog of
-- waiting successors was read by every claim; and "earliest unfinished first"
-- let a late, earlier job run beside the key's running one.
--
-- Now:
-- * A keyed queued job is either its key's head (claimable) or `blocked`
--   (waiting behind the head, outside the ready index). Whatever moves a key
--   on (a finish, a failure, a retry, a release, a cancel or skip) re-settles
--   the key in the same transaction: the earliest unfinished job becomes the
--   only unblocked one, unless a job of the key is running or a failed head
--   holds it under the 'block' policy.
-- * A unique index makes "two running jobs of one key" impossible: a claim
--   that loses a race gets an error (and is retried), never a second run.
-- * Producers (enqueue, replay) and settlers cannot see each other's
--   uncommitted rows under READ COMMITTED. A producer of a key holds a shared
--   advisory lock on the key's bucket until it commits; a settler tries the
--   exclusive lock and, if a producer is in flight, leaves a repair note that
--   a later claim acts on once that producer is over. Producers never wait
--   for each other, and a worker never waits for a producer.

ALTER TABLE {schema}.job ADD COLUMN blocked boolean NOT NULL DEFAULT false;
COMMENT ON COLUMN {schema}.job.blocked IS
    'A queued job of an ordering key that waits behind its key''s head (not claimable).';

-- The ready index holds heads and unordered jobs only: the claim never reads
-- the waiting successors of a key.
DROP INDEX {schema}.job_ready_idx;
CREATE INDEX job_ready_idx ON {schema}.job (queue, priority DESC, available_at, job_id)
    WHERE status = 'queued' AND NOT blocked;

-- leaseq 1 let a late, earlier job of a key run beside the key's running one,
-- so its databases may hold two running jobs of one key, which the index below
-- refuses. Each key keeps its earliest running job; the others go back to the
-- queue (settled behind it at the end of this file) with a new lease version,
-- so their workers' late writes are refused, and their attempt not counted:
-- the upgrade ended it, not the job. (A data repair ahead of the index: the
-- schema this migration makes is unchanged.)
UPDATE {schema}.job AS j
SET status = 'queued',
    lease_until = NULL,
    available_at = {schema}.clock(),
    lease_version = j.lease_version + 1,
    attempts = greatest(j.attempts - 1, 0),
    history = {schema}.history_append(j.history, jsonb_build_object(
        'attempt', j.attempts, 'at', {schema}.clock(), 'outcome', 'released',
        'write', 'upgrade', 'lease_version', j.lease_version, 'claimed_at', j.claimed_at,
        'requeued', 'another job of its key was running'))
WHERE j.ordering_key IS NOT NULL
  AND j.status = 'running'
  AND EXISTS (SELECT 1 FROM {schema}.job AS e
              WHERE e.queue = j.queue AND e.ordering_key = j.ordering_key
                AND e.status = 'running'
                AND (e.ordering_seq, e.job_id) < (j.ordering_seq, j.job_id));

-- At most one running job per key: the database states the invariant.
CREATE UNIQUE INDEX job_running_key_idx ON {schema}.job (queue, ordering_key)
    WHERE status = 'running' AND ordering_key IS NOT NULL;

-- A key's unfinished jobs in order: its earliest one is the first entry.
DROP INDEX {schema}.job_ordering_idx;
CREATE INDEX job_ordering_idx ON {schema}.job (queue, ordering_key, ordering_seq, job_id)
    WHERE ordering_key IS NOT NULL AND status IN ('queued', 'running');

-- A key's failed jobs in order (a failed head holds its key under 'block').
CREATE INDEX job_failed_key_idx ON {schema}.job (queue, ordering_key, ordering_seq, job_id)
    WHERE ordering_key IS NOT NULL AND status = 'failed';

-- A key's claimable jobs (normally one): what re-settling a key rewrites.
CREATE INDEX job_key_head_idx ON {schema}.job (queue, ordering_key)
    WHERE ordering_key IS NOT NULL AND status = 'queued' AND NOT blocked;

-- Keys to settle again once the producers that were in flight are over.
CREATE TABLE {schema}.key_repair (
    repair_id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    queue text NOT NULL,
    ordering_key text NOT NULL,
    next_check timestamptz NOT NULL
);
CREATE INDEX key_repair_due_idx ON {schema}.key_repair (queue, next_check);

-- Keys share 256 advisory locks per schema: a producer holds at most 256 of
-- them however many keys it touches, and a collision only costs a repair note.
CREATE FUNCTION {schema}.key_lock_class() RETURNS integer
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$ SELECT hashtext('leaseq.keys:{schema}.') $$;

CREATE FUNCTION {schema}.key_bucket(p_queue text, p_key text) RETURNS integer
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$ SELECT (hashtextextended(p_queue || E'\x1f' || p_key, 0) & 255)::integer $$;

-- Settle keys: make the earliest unfinished job of each key its only claimable
-- one, or none while a job of the key runs or a failed head holds it ('block'
-- policy). Set-based: a batch statement that moves many keys on settles them
-- all in one statement. plpgsql, so that it runs on a fresh snapshot (READ
-- COMMITTED) and sees every commit up to now, not only those before the
-- statement that called it began.
CREATE FUNCTION {schema}.key_normalize(p_queues text[], p_keys text[]) RETURNS void
    LANGUAGE plpgsql
    AS $$
BEGIN
    WITH keys AS (
        SELECT DISTINCT k.queue, k.ordering_key
        FROM unnest(p_queues, p_keys) AS k (queue, ordering_key)
    ),
    -- Each key's earliest unfinished job, and whether it may run: no job of the
    -- key running, no earlier failed one holding the key. LIMIT 1 probes of one
    -- index each.
    heads AS (
        SELECT h.queue, h.ordering_key, h.job_id, h.ordering_seq,
               CASE WHEN h.status = 'queued' AND h.blocked THEN 'waiting'
                    WHEN h.status = 'queued' THEN 'claimable' ELSE 'running' END AS state,
               h.status = 'queued'
               AND (SELECT r.job_id FROM {schema}.job AS r
                    WHERE r.queue = h.queue AND r.ordering_key = h.ordering_key
                      AND r.status = 'running'
                    LIMIT 1) IS NULL
               AND NOT (
                   coalesce((SELECT q.ordering_policy = 'block' FROM {schema}.queue AS q
                             WHERE q.name = h.queue), true)
                   AND (SELECT f.job_id FROM {schema}.job AS f
                        WHERE f.queue = h.queue AND f.ordering_key = h.ordering_key
                          AND f.status = 'failed'
                          AND (f.ordering_seq, f.job_id) < (h.ordering_seq, h.job_id)
                        ORDER BY f.ordering_seq, f.job_id
                        LIMIT 1) IS NOT NULL) AS may_run
        FROM keys AS k
        CROSS JOIN LATERAL (
            SELECT j.queue, j.ordering_key, j.job_id, j.ordering_seq, j.status, j.blocked
            FROM {schema}.job AS j
            WHERE j.queue = k.queue AND j.ordering_key = k.ordering_key
              AND j.status IN ('queued', 'running')
            ORDER BY j.ordering_seq, j.job_id
            LIMIT 1
        ) AS h
    ),
    -- The head's successors (and the head itself, if it may not run) wait.
    -- Never a job before the head: it committed after the look above, decided
    -- for itself under the bucket's lock, and is the key's new head. Rows
    -- locked by someone else are skipped, never waited for: a producer holds
    -- the rows it re-blocked until it commits (its own job is then the head);
    -- a settler or a cancel settles the key again itself.
    waiting AS (
        UPDATE {schema}.job AS j SET blocked = true
        FROM (
            SELECT o.job_id
            FROM heads AS h
            JOIN {schema}.job AS o
              ON o.queue = h.queue AND o.ordering_key = h.ordering_key
            WHERE o.status = 'queued' AND NOT o.blocked
              AND (o.ordering_seq, o.job_id) >= (h.ordering_seq, h.job_id)
              AND (o.job_id <> h.job_id OR NOT h.may_run)
            FOR UPDATE OF o SKIP LOCKED
        ) AS others
        WHERE j.job_id = others.job_id
    )
    -- The head that may run becomes claimable. (A waiting job's row is only
    -- ever locked briefly: by a cancel, the reaper or another settler.)
    UPDATE {schema}.job AS j SET blocked = false
    FROM heads AS h
    WHERE j.job_id = h.job_id AND h.may_run AND h.state = 'waiting'
      AND j.status = 'queued' AND j.blocked;
END
$$;

-- Re-settle one key after something moved it on, outside the job table's
-- triggers (a change of ordering policy). If a producer of the key's bucket is
-- still in flight, its jobs are invisible here: leave a note so the key is
-- settled again once that producer is over.
CREATE FUNCTION {schema}.key_settle(p_queue text, p_key text) RETURNS void
    LANGUAGE plpgsql
    AS $$
BEGIN
    IF NOT pg_try_advisory_xact_lock({schema}.key_lock_class(), {schema}.key_bucket(p_queue, p_key)) THEN
        INSERT INTO {schema}.key_repair (queue, ordering_key, next_check)
            VALUES (p_queue, p_key, {schema}.clock());
    END IF;
    PERFORM {schema}.key_normalize(ARRAY[p_queue], ARRAY[p_key]);
END
$$;

-- Act on due repair notes of one queue (run by the client when a claim says
-- some are due): settle each key again. A note is dropped only by a settling
-- that held the bucket's exclusive lock, i.e. with no producer of the bucket
-- in flight: settlings without it (this one when the lock is taken, a settler
-- whose try failed) may race other settlings of the key and leave it
-- unsettled, so they only ever add or keep notes.
CREATE FUNCTION {schema}.key_repair_run(p_queue text, p_limit integer) RETURNS integer
    LANGUAGE plpgsql
    AS $$
DECLARE
    note record;
    settled integer := 0;
BEGIN
    FOR note IN
        SELECT k.repair_id, k.ordering_key
        FROM {schema}.key_repair AS k
        WHERE k.queue = p_queue AND k.next_check <= {schema}.clock()
        ORDER BY k.next_check
        LIMIT p_limit
        FOR UPDATE SKIP LOCKED
    LOOP
        IF pg_try_advisory_xact_lock({schema}.key_lock_class(),
                                     {schema}.key_bucket(p_queue, note.ordering_key)) THEN
            PERFORM {schema}.key_normalize(ARRAY[p_queue], ARRAY[note.ordering_key]);
            DELETE FROM {schema}.key_repair AS k WHERE k.repair_id = note.repair_id;
            settled := settled + 1;
        ELSE
            -- What is visible already may let the key move; look again soon
            -- (not at every claim: a producer may stay in flight for long, or
            -- producers of other keys of the bucket may keep it busy).
            PERFORM {schema}.key_normalize(ARRAY[p_queue], ARRAY[note.ordering_key]);
            UPDATE {schema}.key_repair AS k
            SET next_check = {schema}.clock() + interval '200 milliseconds'
            WHERE k.repair_id = note.repair_id;
        END IF;
    END LOOP;
    RETURN settled;
END
$$;

-- A job joins its key (enqueue, or replay of a failed or cancelled job),
-- under the key bucket's shared lock (held until the producer commits) and on
-- snapshots taken after it: the key's claimable jobs that come after it wait
-- behind it, and it waits itself if a job of the key runs, an earlier one is
-- queued, or an earlier one failed under 'block'.
CREATE FUNCTION {schema}.job_key_enter() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
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

CREATE TRIGGER job_key_enter_insert
    BEFORE INSERT ON {schema}.job
    FOR EACH ROW
    -- (enqueue_many inserts all but a batch's earliest job of a key blocked)
    WHEN (NEW.ordering_key IS NOT NULL AND NEW.status = 'queued' AND NOT NEW.blocked)
    EXECUTE FUNCTION {schema}.job_key_enter();

CREATE TRIGGER job_key_enter_replay
    BEFORE UPDATE OF status ON {schema}.job
    FOR EACH ROW
    WHEN (NEW.ordering_key IS NOT NULL AND NEW.status = 'queued'
          AND OLD.status IN ('failed', 'cancelled'))
    EXECUTE FUNCTION {schema}.job_key_enter();

-- A job moved its key on: it stopped running (done, failed, retried,
-- released), left the queue unfinished (cancelled, reaped) or, failed, was
-- skipped; or its row was deleted. The row trigger (its WHEN clause runs in C:
-- unordered jobs never call it) tries the bucket's lock, leaves a note if a
-- producer holds it, and collects the key; at the end of the statement one
-- statement trigger settles every key collected, in one set-based statement.
-- The collection is a transaction-local setting, filled and emptied within
-- the one statement that moved the keys (a rollback empties it too).
CREATE FUNCTION {schema}.job_key_leave() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
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

-- (No WHEN clause: a statement trigger's WHEN is evaluated before the row
-- triggers of its statement have run, so it would never see their keys.
-- Statements that moved no key return at the first line.)
CREATE FUNCTION {schema}.job_keys_settle() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
DECLARE
    collected text := coalesce(current_setting('leaseq.keys_to_settle', true), '');
BEGIN
    IF collected = '' THEN
        RETURN NULL;
    END IF;
    PERFORM set_config('leaseq.keys_to_settle', '', true);
    PERFORM {schema}.key_normalize(array_agg(k ->> 0), array_agg(k ->> 1))
    FROM jsonb_array_elements(('[' || ltrim(collected, ',') || ']')::jsonb) AS k;
    RETURN NULL;
END
$$;

CREATE TRIGGER job_key_leave_update
    AFTER UPDATE OF status ON {schema}.job
    FOR EACH ROW
    WHEN (OLD.ordering_key IS NOT NULL AND (
          (OLD.status = 'running' AND NEW.status <> 'running')
          OR (OLD.status = 'queued' AND NEW.status NOT IN ('queued', 'running'))
          OR (OLD.status = 'failed' AND NEW.status = 'cancelled')))
    EXECUTE FUNCTION {schema}.job_key_leave();

CREATE TRIGGER job_key_leave_delete
    AFTER DELETE ON {schema}.job
    FOR EACH ROW
    WHEN (OLD.ordering_key IS NOT NULL AND OLD.status IN ('queued', 'running', 'failed'))
    EXECUTE FUNCTION {schema}.job_key_leave();

CREATE TRIGGER job_keys_settle_update
    AFTER UPDATE OF status ON {schema}.job
    FOR EACH STATEMENT
    EXECUTE FUNCTION {schema}.job_keys_settle();

CREATE TRIGGER job_keys_settle_delete
    AFTER DELETE ON {schema}.job
    FOR EACH STATEMENT
    EXECUTE FUNCTION {schema}.job_keys_settle();

-- Jobs enqueued before this migration: settle every key once.
SELECT {schema}.key_normalize(array_agg(k.queue), array_agg(k.ordering_key))
FROM (SELECT DISTINCT j.queue, j.ordering_key FROM {schema}.job AS j
      WHERE j.ordering_key IS NOT NULL AND j.status IN ('queued', 'failed')) AS k;
