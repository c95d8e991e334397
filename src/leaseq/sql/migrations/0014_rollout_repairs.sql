-- leaseq migration 0014: what a rolling upgrade needs of the schema and did not
-- get from earlier migrations ("migrate first, then deploy": the older
-- version's producers and workers run on the migrated schema meanwhile).

-- 0009 replaced enqueue_unique() by one that also takes the job's group, and
-- dropped the one of 0007: every unique enqueue of a producer of leaseq at
-- migration 7 or 8 failed until that producer was deployed anew. Its call
-- keeps working: ungrouped, as it always was.
CREATE FUNCTION {schema}.enqueue_unique(
    p_queue text, p_channel text, p_payload jsonb, p_payload_bytes integer,
    p_priority smallint, p_available_at timestamptz, p_max_attempts integer,
    p_ordering_key text, p_ordering_seq bigint, p_idempotency_key text,
    p_trace_context jsonb, p_timeout double precision,
    p_unique_key text, p_unique_for double precision)
    RETURNS TABLE (job_id bigint, existing boolean)
    LANGUAGE sql
    ROWS 1
    AS $$
    SELECT * FROM {schema}.enqueue_unique(
        p_queue, p_channel, p_payload, p_payload_bytes, p_priority, p_available_at,
        p_max_attempts, p_ordering_key, p_ordering_seq, p_idempotency_key,
        p_trace_context, p_timeout, p_unique_key, p_unique_for, NULL::text)
$$;

-- 0013 made a cut lease hold its key (key_hold) for every head made claimable
-- later, but kept no hold for the leases cut before it: a job of the key could
-- start beside a handler still running on such a lease. Each lease cut short
-- and not yet ended holds its key now: a running job cancelled (its history
-- keeps the cut lease's end, also after a replay), or released while its
-- handler ran on (its own available_at is that end). The key's head claimable
-- now waits for it too.
INSERT INTO {schema}.key_hold AS h (queue, ordering_key, until)
SELECT held.queue, held.ordering_key, max(held.until)
FROM (
    SELECT j.queue, j.ordering_key, (e.entry ->> 'cut_lease_until')::timestamptz AS until
    FROM {schema}.job AS j
    CROSS JOIN LATERAL jsonb_array_elements(j.history) AS e (entry)
    WHERE j.ordering_key IS NOT NULL
      AND j.status IN ('cancelled', 'queued')
      AND e.entry ? 'cut_lease_until'
    UNION ALL
    SELECT j.queue, j.ordering_key, j.available_at
    FROM {schema}.job AS j
    WHERE j.ordering_key IS NOT NULL
      AND j.status = 'queued'
      AND j.available_at > {schema}.clock()
      AND j.history -> -1 ->> 'write' = 'release'
) AS held
WHERE held.until > {schema}.clock()
GROUP BY held.queue, held.ordering_key
ON CONFLICT (queue, ordering_key) DO UPDATE SET until = greatest(h.until, excluded.until);

UPDATE {schema}.job AS n
SET available_at = h.until
FROM {schema}.key_hold AS h
WHERE h.until > {schema}.clock()
  AND n.queue = h.queue AND n.ordering_key = h.ordering_key
  AND n.status = 'queued' AND NOT n.blocked
  AND n.available_at < h.until;

-- And from now on the hold is written where the key is left (job_key_leave,
-- the row trigger of 0002/0010), not by the statements that cut a lease: an
-- older leaseq cutting a lease during the rollout writes none itself, and the
-- statement's settling of the key, which runs after its row triggers, then
-- sees the hold when it makes the next head claimable.
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

-- 0007 was edited after it shipped (the result_awaited columns were added to
-- it): a schema migrated with its first text recorded 0007 as applied and never
-- got them, and every completion there failed. Added where missing.
ALTER TABLE {schema}.job ADD COLUMN IF NOT EXISTS result_awaited boolean NOT NULL DEFAULT false;
ALTER TABLE {schema}.job_archive
    ADD COLUMN IF NOT EXISTS result_awaited boolean NOT NULL DEFAULT false;
