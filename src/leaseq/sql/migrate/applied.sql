SELECT version FROM {schema}.migration ORDER BY version
