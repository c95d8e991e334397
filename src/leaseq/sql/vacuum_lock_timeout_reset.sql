-- After the maintenance leader's VACUUM or ANALYZE (vacuum_lock_timeout.sql): its
-- session's lock_timeout is again what the connection set (the URL's, or none).
RESET lock_timeout
