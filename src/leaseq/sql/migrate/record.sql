INSERT INTO {schema}.migration (version, name) VALUES (%(version)s, %(name)s)
