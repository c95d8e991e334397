-- How long each later statement of this migration may wait for a lock (for
-- this transaction only). A DDL statement waiting for a table's lock holds up
-- every later statement on that table, the workers' claims and the producers'
-- enqueues, for as long as it waits: behind a long transaction, for as long as
-- that lasted. Past this wait the migration gives its locks back and tries
-- again (_migrate.lock_waits). Set after the migrators' advisory lock, which
-- holds up no one else.
SELECT set_config('lock_timeout', %(lock_timeout)s, true)
