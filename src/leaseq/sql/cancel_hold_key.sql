-- After cancel.sql, in its transaction. A running job of an ordering key, now
-- cancelled: its handler runs on until its worker hears (a notification, at
-- the latest its next renewal). The key's next job waits until the cancelled
-- claim's lease would have ended, as a replay of the job itself does, so that
-- two jobs of a key never run at once. The next job is the key's earliest
-- queued one, which settling the key makes its head (cancel.sql's trigger, or
-- a repair later if a producer of the key was in flight).
--
-- Its own statement: a second UPDATE of the job table in cancel.sql would take
-- the place of the first's statement-level trigger, which then never settled
-- the key (PostgreSQL fires one AFTER STATEMENT event per table and query).
UPDATE {schema}.job AS n
SET available_at = greatest(n.available_at, c.cut_lease_until)
FROM (
    SELECT j.job_id, j.queue, j.ordering_key,
           (j.history -> -1 ->> 'cut_lease_until')::timestamptz AS cut_lease_until
    FROM {schema}.job AS j
    WHERE j.job_id = %(job_id)s AND j.status = 'cancelled' AND j.ordering_key IS NOT NULL
) AS c
WHERE c.cut_lease_until > {schema}.clock()
  AND n.job_id = (
      SELECT e.job_id FROM {schema}.job AS e
      WHERE e.queue = c.queue AND e.ordering_key = c.ordering_key
        AND e.status = 'queued' AND e.job_id <> c.job_id
      ORDER BY e.ordering_seq, e.job_id
      LIMIT 1)
