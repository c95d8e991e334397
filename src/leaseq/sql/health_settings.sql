-- The server settings table health depends on: whether autovacuum runs at all
-- (it needs track_counts), the timeout that would end a forgotten
-- idle-in-transaction session, and whether this role sees the transactions of
-- other roles' sessions (pg_stat_activity shows their xmin only to superusers
-- and members of pg_read_all_stats): if not, what holds back cleanup may be
-- missing from health_holders.sql. Last, whether this role may vacuum and
-- analyze the job table (as in vacuum_check.sql): a maintenance leader of a
-- role that may not leaves it to the owner when autovacuum is off.
SELECT current_setting('autovacuum')::boolean,
       current_setting('track_counts')::boolean,
       current_setting('idle_in_transaction_session_timeout'),
       current_setting('server_version_num')::integer,
       coalesce((SELECT r.rolsuper FROM pg_roles AS r WHERE r.rolname = current_user), false)
           OR pg_has_role(current_user, 'pg_read_all_stats', 'USAGE'),
       current_user::text,
       coalesce((SELECT pg_has_role(c.relowner, 'USAGE')
                        OR pg_has_role((SELECT d.datdba FROM pg_database AS d
                                        WHERE d.datname = current_database()), 'USAGE')
                        OR CASE WHEN current_setting('server_version_num')::int >= 170000
                                THEN has_table_privilege(c.oid, 'MAINTAIN') ELSE false END
                 FROM pg_class AS c
                 WHERE c.oid = to_regclass(%(job_table)s)), true)
