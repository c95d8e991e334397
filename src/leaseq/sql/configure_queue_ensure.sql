INSERT INTO {schema}.queue (name) VALUES (%(name)s) ON CONFLICT (name) DO NOTHING
