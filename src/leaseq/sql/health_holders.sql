-- What holds back cleanup: VACUUM cannot remove a row version that some open
-- snapshot may still see. Sessions of this database (and walsenders, whose
-- hot_standby_feedback reports a standby's snapshot) with an xmin or an xid,
-- replication slots and prepared transactions, oldest first. This statement's
-- own session and autovacuum workers (ignored by vacuum) are left out. No
-- query text: it may hold secrets, and the state says enough.
SELECT h.kind, h.name, h.state, h.owner, h.held_seconds, h.xmin_age
FROM (
    SELECT 'session' AS kind,
           'pid ' || a.pid || CASE WHEN a.application_name <> ''
                                   THEN ' (' || a.application_name || ')' ELSE '' END AS name,
           coalesce(a.state, a.backend_type) AS state,
           a.usename::text AS owner,
           extract(epoch FROM clock_timestamp() - a.xact_start)::double precision AS held_seconds,
           greatest(age(a.backend_xmin), age(a.backend_xid)) AS xmin_age
    FROM pg_stat_activity AS a
    WHERE (a.backend_xmin IS NOT NULL OR a.backend_xid IS NOT NULL)
      AND a.pid <> pg_backend_pid()
      AND a.backend_type <> 'autovacuum worker'
      AND (a.datname = current_database() OR a.datname IS NULL)
    UNION ALL
    SELECT 'replication slot', r.slot_name::text,
           CASE WHEN r.active THEN 'active' ELSE 'inactive' END,
           NULL, NULL,
           age(r.xmin)
    FROM pg_replication_slots AS r
    WHERE r.xmin IS NOT NULL
    UNION ALL
    SELECT 'prepared transaction', p.gid, 'prepared', p.owner::text,
           extract(epoch FROM clock_timestamp() - p.prepared)::double precision,
           age(p.transaction)
    FROM pg_prepared_xacts AS p
    WHERE p.database = current_database()
) AS h
ORDER BY h.xmin_age DESC NULLS LAST, h.held_seconds DESC NULLS LAST
LIMIT 5
