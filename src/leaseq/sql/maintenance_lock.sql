-- One maintenance leader per schema: a session lock, held by a dedicated
-- connection for as long as it leads; it ends when that session does.
SELECT pg_try_advisory_lock(hashtext('leaseq.maintenance'), hashtext(%(schema_name)s))
