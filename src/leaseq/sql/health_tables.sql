-- Per table of the schema: sizes, live and dead tuples (the statistics
-- collector's counts, a moment behind), the last (auto)vacuum and analyze, and
-- whether autovacuum is enabled for the table itself (a reloption).
SELECT c.relname,
       pg_total_relation_size(c.oid),
       pg_relation_size(c.oid),
       pg_indexes_size(c.oid),
       greatest(c.reltuples, 0)::bigint,
       coalesce(s.n_live_tup, 0),
       coalesce(s.n_dead_tup, 0),
       s.last_vacuum, s.last_autovacuum, s.last_analyze, s.last_autoanalyze,
       coalesce((SELECT o.option_value::boolean
                 FROM pg_options_to_table(c.reloptions) AS o
                 WHERE o.option_name = 'autovacuum_enabled'), true)
FROM pg_class AS c
JOIN pg_namespace AS n ON n.oid = c.relnamespace
LEFT JOIN pg_stat_user_tables AS s ON s.relid = c.oid
WHERE n.nspname = %(schema_name)s AND c.relkind IN ('r', 'p')
ORDER BY pg_total_relation_size(c.oid) DESC, c.relname
