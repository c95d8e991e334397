-- leaseq migration 0020: an enqueue sends its wake-up NOTIFY only while some
-- worker waits for one on the job's queue.
--
-- PostgreSQL takes one lock for every notifying commit and holds it through
-- the commit's WAL flush: with 16 producers committing at once, notifying
-- cost 43 % of their enqueues (bench/README.md, 2026-12-05). A notification
-- only matters to a worker that waits for one: one that is busy claims again
-- as its slots free up, and none at all reads it later.
--
-- A worker that found less to claim on a queue than it could take enters a
-- row here (waiter_enter) before it waits; it leaves once its claims of the
-- queue come back full for a while (waiter_leave). An enqueue notifies if
-- wake_wanted() finds a row for its queue.
--
-- No wake-up is lost in between. wake_wanted() gives its transaction an id
-- before it reads, on a snapshot of its own (READ COMMITTED: each statement
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
-- The functions run as the schema's owner, so that no role needs a grant on
-- the new table (producers keep the grants README.md lists).
CREATE TABLE {schema}.waiter (
    queue text NOT NULL,
    -- Which worker (host:pid:random): its own rows, entered and left by it.
    worker text NOT NULL,
    -- A worker that ended without leaving (killed) is removed by the reaper's
    -- round after this; a live one moves it on well before.
    expires_at timestamptz NOT NULL,
    PRIMARY KEY (queue, worker)
);

-- Workers of an older leaseq wait for notifications without entering a row:
-- on a schema already in use, every enqueue notifies for a day (the queue ''
-- stands for all), the time a rolling upgrade has to replace them.
INSERT INTO {schema}.waiter (queue, worker, expires_at)
SELECT '', 'workers of leaseq before migration 20', statement_timestamp() + interval '1 day'
WHERE EXISTS (SELECT 1 FROM {schema}.queue);

CREATE FUNCTION {schema}.wake_wanted(p_queue text) RETURNS boolean
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
    AS $$
BEGIN
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        RETURN true;
    END IF;
    PERFORM pg_current_xact_id();  -- the id first, then the read (see above)
    RETURN EXISTS (SELECT 1 FROM {schema}.waiter WHERE queue IN (p_queue, ''));
END
$$;

CREATE FUNCTION {schema}.waiter_enter(p_queues text[], p_worker text, p_seconds double precision)
    RETURNS void
    LANGUAGE sql VOLATILE SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
    AS $$
    INSERT INTO {schema}.waiter (queue, worker, expires_at)
    SELECT q, p_worker, {schema}.clock() + make_interval(secs => p_seconds)
    FROM unnest(p_queues) AS q
    ON CONFLICT (queue, worker) DO UPDATE SET expires_at = excluded.expires_at
$$;

-- The worker's rows moved on; the queues it still has a row for come back
-- (one the reaper removed, or a restore, is entered again by the worker).
CREATE FUNCTION {schema}.waiter_refresh(p_worker text, p_seconds double precision)
    RETURNS SETOF text
    LANGUAGE sql VOLATILE SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
    AS $$
    UPDATE {schema}.waiter SET expires_at = {schema}.clock() + make_interval(secs => p_seconds)
    WHERE worker = p_worker
    RETURNING queue
$$;

CREATE FUNCTION {schema}.waiter_leave(p_queues text[], p_worker text) RETURNS void
    LANGUAGE sql VOLATILE SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
    AS $$
    DELETE FROM {schema}.waiter WHERE queue = ANY (p_queues) AND worker = p_worker
$$;

CREATE FUNCTION {schema}.waiter_expire() RETURNS bigint
    LANGUAGE sql VOLATILE SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
    AS $$
    WITH gone AS (
        DELETE FROM {schema}.waiter WHERE expires_at < {schema}.clock() RETURNING 1
    )
    SELECT count(*) FROM gone
$$;
