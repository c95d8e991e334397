SELECT version, name FROM {schema}.migration ORDER BY version
