-- The server settings table health depends on: whether autovacuum runs at all
-- (it needs track_counts), the timeout that would end a forgotten
-- idle-in-transaction session, and whether this role sees the transactions of
-- other roles' sessions (pg_stat_activity shows their xmin only to superusers
-- and members of pg_read_all_stats): if not, what holds back cleanup may be
-- missing from health_holders.sql.
SELECT current_setting('autovacuum')::boolean,
       current_setting('track_counts')::boolean,
       current_setting('idle_in_transaction_session_timeout'),
       current_setting('server_version_num')::integer,
       coalesce((SELECT r.rolsuper FROM pg_roles AS r WHERE r.rolname = current_user), false)
           OR pg_has_role(current_user, 'pg_read_all_stats', 'USAGE'),
       current_user::text
