-- One migrator per schema at a time; the lock ends with the transaction.
SELECT pg_advisory_xact_lock(hashtext('leaseq.migrate'), hashtext(%(schema_name)s))
