-- leaseq migration 0013: a key whose running job was cut short stays held
-- until the cut lease would have ended.
--
-- A running job cancelled (cancel(running=True)), or released while its
-- handler runs on (a thread that cannot be stopped), may still be running
-- until its lease would have ended. Before, only the key's next job at that
-- moment waited for that end (its available_at moved): a job that became the
-- key's head later (the next one cancelled, a new enqueue, a replay) was
-- claimable at once, beside the handler still running.
--
-- Now the hold belongs to the key: key_hold keeps the end of the cut lease, and
-- a head that becomes claimable, by settling its key (key_normalize) or by
-- entering it (job_key_enter), waits until then. One probe of a small table,
-- only when a head is made claimable. Maintenance drops ended holds.

CREATE TABLE {schema}.key_hold (
    queue text NOT NULL,
    ordering_key text NOT NULL,
    until timestamptz NOT NULL,
    PRIMARY KEY (queue, ordering_key)
);

-- When the key's hold ends, or NULL if it holds nothing now (greatest()
-- ignores a NULL).
CREATE FUNCTION {schema}.key_held_until(p_queue text, p_key text) RETURNS timestamptz
    LANGUAGE plpgsql STABLE
    AS $$
BEGIN
    RETURN (SELECT h.until FROM {schema}.key_hold AS h
            WHERE h.queue = p_queue AND h.ordering_key = p_key AND h.until > {schema}.clock());
END
$$;

-- As in 0002, a head made claimable waits for its key's hold.
CREATE OR REPLACE FUNCTION {schema}.key_normalize(p_queues text[], p_keys text[]) RETURNS void
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
    UPDATE {schema}.job AS j
    SET blocked = false,
        available_at = greatest(j.available_at, {schema}.key_held_until(h.queue, h.ordering_key))
    FROM heads AS h
    WHERE j.job_id = h.job_id AND h.may_run AND h.state = 'waiting'
      AND j.status = 'queued' AND j.blocked;
END
$$;

-- As in 0010, a job that enters its key claimable waits for the key's hold.
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
    IF NOT NEW.blocked THEN
        NEW.available_at := greatest(NEW.available_at,
                                     {schema}.key_held_until(NEW.queue, NEW.ordering_key));
    END IF;
    IF NEW.blocked AND current_setting('transaction_isolation') <> 'read committed' THEN
        -- A transaction snapshot may predate the commit that freed the key.
        INSERT INTO {schema}.key_repair (queue, ordering_key, next_check)
            VALUES (NEW.queue, NEW.ordering_key, {schema}.clock());
    END IF;
    RETURN NEW;
END
$$;
