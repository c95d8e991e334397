-- configure_queue naming no setting: the queue's settings are read inside a
-- savepoint (settings_probe_end.sql rolls it back), so that a queue never used
-- shows its defaults without getting a row.
SAVEPOINT leaseq_settings_probe
