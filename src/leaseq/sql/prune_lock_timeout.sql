-- How long each later statement of the maintenance leader's retention batch may
-- wait for a lock (for this transaction only). A batch waiting for a table's
-- lock (an operator's CREATE INDEX or VACUUM FULL of job_archive) held the
-- leader with it, and nothing was reaped for as long as that lasted. Past this
-- wait the batch writes nothing; the leader reaps on and tries it next round.
SELECT set_config('lock_timeout', %(lock_timeout)s, true)
