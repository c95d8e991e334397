-- See settings_probe_begin.sql.
ROLLBACK TO SAVEPOINT leaseq_settings_probe
