-- Run by the maintenance leader only when autovacuum is off for the job table
-- and its rows changed since its last ANALYZE past the threshold, without dead
-- rows enough for a vacuum (see vacuum_check.sql): a backlog being built.
ANALYZE {schema}.job
