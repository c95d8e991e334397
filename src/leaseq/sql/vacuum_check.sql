-- For the maintenance leader: is autovacuum off for the job table (the server
-- setting, track_counts, or the table's reloption), whether changes are counted
-- at all (track_counts: without it the counts stay whatever they were, and a
-- vacuum does not reset them), its dead tuples, its rows changed since its last
-- ANALYZE, its size, and whether this session may vacuum and analyze it at all:
-- its owner (or a member of the owner's role, or a superuser), the database's
-- owner, and from PostgreSQL 17 a role granted MAINTAIN on it may; anyone
-- else's VACUUM is skipped with only a warning in the server's log.
SELECT NOT (current_setting('autovacuum')::boolean
            AND current_setting('track_counts')::boolean
            AND coalesce((SELECT o.option_value::boolean
                          FROM pg_options_to_table(c.reloptions) AS o
                          WHERE o.option_name = 'autovacuum_enabled'), true)),
       current_setting('track_counts')::boolean,
       coalesce(s.n_dead_tup, 0),
       coalesce(s.n_mod_since_analyze, 0),
       greatest(c.reltuples, 0)::bigint,
       pg_has_role(c.relowner, 'USAGE')
           OR pg_has_role((SELECT d.datdba FROM pg_database AS d
                           WHERE d.datname = current_database()), 'USAGE')
           OR CASE WHEN current_setting('server_version_num')::int >= 170000
                   THEN has_table_privilege(c.oid, 'MAINTAIN') ELSE false END
FROM pg_class AS c
LEFT JOIN pg_stat_user_tables AS s ON s.relid = c.oid
WHERE c.oid = to_regclass(%(job_table)s)
