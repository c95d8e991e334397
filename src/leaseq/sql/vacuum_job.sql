-- Run by the maintenance leader only when autovacuum is off for the job table
-- (see vacuum_check.sql). Not in a transaction: VACUUM cannot run in one.
VACUUM (ANALYZE) {schema}.job
