-- Per index of the schema: its table, size and how often it was scanned.
SELECT t.relname, i.relname, pg_relation_size(i.oid), coalesce(s.idx_scan, 0)
FROM pg_index AS x
JOIN pg_class AS i ON i.oid = x.indexrelid
JOIN pg_class AS t ON t.oid = x.indrelid
JOIN pg_namespace AS n ON n.oid = t.relnamespace
LEFT JOIN pg_stat_user_indexes AS s ON s.indexrelid = i.oid
WHERE n.nspname = %(schema_name)s
ORDER BY t.relname, pg_relation_size(i.oid) DESC, i.relname
