-- Before the maintenance leader's VACUUM or ANALYZE of the job table (on its own
-- session: VACUUM cannot run in a transaction, so for the session, until
-- vacuum_lock_timeout_reset.sql): how long it may wait for the table's lock.
-- An operator's own VACUUM, ANALYZE or CREATE INDEX CONCURRENTLY of the table
-- holds that lock for minutes or hours, and the leader waited as long, reaping
-- nothing meanwhile. Past this wait it leaves the vacuum for a later round.
SELECT set_config('lock_timeout', %(lock_timeout)s, false)
