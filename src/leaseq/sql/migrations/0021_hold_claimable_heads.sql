-- leaseq migration 0021: a lease cut short holds its key's head also when that
-- head was claimable already.
--
-- A job of a key can be claimable (not waiting) while another job of the key
-- runs, or beside another claimable one: a producer that re-blocked the key's
-- later jobs (job_key_enter) rolled back, and a job that entered meanwhile
-- skipped those rows, locked by it; or a claim in flight held the row. The
-- claim's own checks still run such jobs one at a time and in order. But the
-- hold of a lease cut short (cancelled while running, or released while its
-- handler runs on: key_hold, 0013) was put only on a head made claimable from
-- waiting, so a head claimable already started at once, beside the handler
-- still running on the cut lease.
--
-- Now settling a key also gives its hold to a head that may run and is
-- claimable already. A key's head is claimable when settled only in those
-- rare states, so the usual settle pays nothing more. Its row is skipped if
-- someone else holds it, as the successors' rows are: only a producer holds
-- such a row for long (it re-blocks it, until it commits), and waiting for it
-- would hold the settler's locks (its job's row, the queue's counters) for
-- that long, or deadlock with it. Such a producer's commit leaves the row
-- waiting, and the head it makes claimable later gets the hold; only its
-- rollback would leave the row claimable without it. Otherwise as in 0013.
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
    ),
    -- A head claimable already waits for its key's hold too. (Skipped if locked,
    -- as above: a producer holds such a row for as long as its transaction.)
    held AS (
        UPDATE {schema}.job AS j SET available_at = claimable.until
        FROM (
            SELECT o.job_id, hold.until
            FROM heads AS h
            JOIN {schema}.job AS o ON o.job_id = h.job_id
            CROSS JOIN LATERAL (
                SELECT {schema}.key_held_until(h.queue, h.ordering_key) AS until
            ) AS hold
            WHERE h.may_run AND h.state = 'claimable'
              AND o.status = 'queued' AND NOT o.blocked AND o.available_at < hold.until
            FOR UPDATE OF o SKIP LOCKED
        ) AS claimable
        WHERE j.job_id = claimable.job_id
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

-- Heads left claimable under a live hold by the code before (the state above).
UPDATE {schema}.job AS n
SET available_at = h.until
FROM {schema}.key_hold AS h
WHERE h.until > {schema}.clock()
  AND n.queue = h.queue AND n.ordering_key = h.ordering_key
  AND n.status = 'queued' AND NOT n.blocked
  AND n.available_at < h.until;
