-- One maintenance leader per schema: a session lock, held by a dedicated
-- connection for as long as it leads; it ends when that session does. Keyed by
-- the schema's OID, unique in the database (as an integer, one to one): two
-- schema names whose hashtext() is the same shared one lock, and the second
-- schema had no leader while the first one's ran.
SELECT pg_try_advisory_lock(
    hashtext('leaseq.maintenance.schema_oid'),
    (SELECT n.oid::integer FROM pg_namespace AS n WHERE n.nspname = %(schema_name)s))
