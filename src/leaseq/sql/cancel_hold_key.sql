-- After cancel.sql, in its transaction. A running job of an ordering key, now
-- cancelled: its handler runs on until its worker hears (a notification, at
-- the latest its next renewal). No job of the key may start before the
-- cancelled claim's lease would have ended, so that two jobs of a key never
-- run at once: the key is held until then (key_hold, migration 0013), which
-- every head made claimable later waits for, and the key's head claimable now
-- (cancel.sql's settling made it so) waits too.
--
-- Its own statement: a second UPDATE of the job table in cancel.sql would take
-- the place of the first's statement-level trigger, which then never settled
-- the key (PostgreSQL fires one AFTER STATEMENT event per table and query).
WITH cut AS (
    SELECT j.job_id, j.queue, j.ordering_key,
           (j.history -> -1 ->> 'cut_lease_until')::timestamptz AS until
    FROM {schema}.job AS j
    WHERE j.job_id = %(job_id)s AND j.status = 'cancelled' AND j.ordering_key IS NOT NULL
),
held AS (
    INSERT INTO {schema}.key_hold AS h (queue, ordering_key, until)
    SELECT c.queue, c.ordering_key, c.until FROM cut AS c WHERE c.until > {schema}.clock()
    ON CONFLICT (queue, ordering_key) DO UPDATE SET until = greatest(h.until, excluded.until)
)
UPDATE {schema}.job AS n
SET available_at = greatest(n.available_at, c.until)
FROM cut AS c
WHERE c.until > {schema}.clock()
  AND n.queue = c.queue AND n.ordering_key = c.ordering_key
  AND n.status = 'queued' AND NOT n.blocked AND n.job_id <> c.job_id
