-- What a caller's own SQL on a connection of leaseq's pool (connection(),
-- job.connection()) may have left in its session, undone before the connection
-- goes back to the pool: its settings (a statement_timeout, read-only
-- transactions, a search_path), a role, LISTENs, session advisory locks, open
-- cursors and temporary tables. DISCARD ALL without its DEALLOCATE ALL and
-- DISCARD PLANS: prepared statements stay, those of the driver's cache (and of
-- a pooler's) still valid.
SET SESSION AUTHORIZATION DEFAULT;
RESET ALL;
UNLISTEN *;
SELECT pg_advisory_unlock_all();
CLOSE ALL;
DISCARD TEMP;
DISCARD SEQUENCES
