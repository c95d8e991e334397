-- A description of everything in one schema that does not depend on the
-- server's version or on object ids: what the golden-schema test compares
-- (after replacing the schema's own name with a placeholder).
SELECT 'column' AS kind,
       c.relname || '.' || a.attname || ' ' || format_type(a.atttypid, a.atttypmod)
           || CASE WHEN a.attnotnull THEN ' NOT NULL' ELSE '' END
           || coalesce(' DEFAULT ' || pg_get_expr(d.adbin, d.adrelid), '')
           || CASE WHEN a.attidentity <> '' THEN ' IDENTITY ' || a.attidentity::text ELSE '' END
FROM pg_attribute AS a
JOIN pg_class AS c ON c.oid = a.attrelid
JOIN pg_namespace AS n ON n.oid = c.relnamespace
LEFT JOIN pg_attrdef AS d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
WHERE n.nspname = %(schema_name)s AND c.relkind = 'r' AND a.attnum > 0 AND NOT a.attisdropped
UNION ALL
SELECT 'constraint', c.relname || ' ' || pg_get_constraintdef(k.oid)
FROM pg_constraint AS k
JOIN pg_class AS c ON c.oid = k.conrelid
JOIN pg_namespace AS n ON n.oid = c.relnamespace
-- PostgreSQL 18 also lists NOT NULL as constraints; the column lines carry them.
WHERE n.nspname = %(schema_name)s AND k.contype <> 'n'
UNION ALL
SELECT 'index', pg_get_indexdef(i.indexrelid)
FROM pg_index AS i
JOIN pg_class AS c ON c.oid = i.indrelid
JOIN pg_namespace AS n ON n.oid = c.relnamespace
WHERE n.nspname = %(schema_name)s
UNION ALL
SELECT 'table options', c.relname || ' ' || array_to_string(c.reloptions, ',')
FROM pg_class AS c
JOIN pg_namespace AS n ON n.oid = c.relnamespace
WHERE n.nspname = %(schema_name)s AND c.reloptions IS NOT NULL
UNION ALL
SELECT 'function', p.proname || '(' || pg_get_function_arguments(p.oid) || ') '
           || pg_get_function_result(p.oid) || ' volatility=' || p.provolatile::text
           || CASE WHEN p.proretset THEN ' rows=' || p.prorows::text ELSE '' END
           || ' language=' || l.lanname || ' body:' || p.prosrc
FROM pg_proc AS p
JOIN pg_namespace AS n ON n.oid = p.pronamespace
JOIN pg_language AS l ON l.oid = p.prolang
WHERE n.nspname = %(schema_name)s
UNION ALL
SELECT 'trigger', pg_get_triggerdef(t.oid)
FROM pg_trigger AS t
JOIN pg_class AS c ON c.oid = t.tgrelid
JOIN pg_namespace AS n ON n.oid = c.relnamespace
WHERE n.nspname = %(schema_name)s AND NOT t.tgisinternal
ORDER BY 1, 2
