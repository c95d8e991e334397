INSERT INTO {schema}.demo_flag (name, enabled) VALUES (%(name)s, %(enabled)s)
ON CONFLICT (name) DO UPDATE SET enabled = excluded.enabled
