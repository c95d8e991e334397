-- Whether the schema's table "migration" is leaseq's own: a plain table with
-- its columns. CREATE TABLE IF NOT EXISTS (prepare.sql) takes any relation of
-- that name: a view over someone's table was written into, and someone's own
-- migration table made leaseq report "up to date" having made nothing.
SELECT c.relkind = 'r' AND (
           SELECT array_agg(a.attname::text || ' ' || format_type(a.atttypid, a.atttypmod))
           FROM pg_attribute AS a
           WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
       ) @> ARRAY['version integer', 'name text', 'applied_at timestamp with time zone']
FROM pg_class AS c
WHERE c.oid = to_regclass(%(migration_table)s)
