-- For the maintenance leader: is autovacuum off for the job table (the server
-- setting, track_counts, or the table's reloption), how many dead tuples it has
-- against its size, and whether dead tuples are counted at all (track_counts:
-- without it the count stays whatever it was, and a vacuum does not reset it).
SELECT NOT (current_setting('autovacuum')::boolean
            AND current_setting('track_counts')::boolean
            AND coalesce((SELECT o.option_value::boolean
                          FROM pg_options_to_table(c.reloptions) AS o
                          WHERE o.option_name = 'autovacuum_enabled'), true)),
       coalesce(s.n_dead_tup, 0),
       greatest(c.reltuples, 0)::bigint,
       current_setting('track_counts')::boolean
FROM pg_class AS c
LEFT JOIN pg_stat_user_tables AS s ON s.relid = c.oid
WHERE c.oid = to_regclass(%(job_table)s)
