-- leaseq migration 0024: each audit row records the database role that wrote it.
--
-- `actor` is the name the caller gives (the CLI's "cli:<OS user>", read from
-- $USER/$LOGNAME; the dashboard's user; any text a library call passes), and
-- nothing verifies it: `USER=alice leaseq cancel 7` was recorded as alice's.
-- `db_role` is the role the server authenticated for the session
-- (`session_user`: a SET ROLE does not change it), filled in by the column's
-- default, so every statement that writes the log records it without naming it.
-- Rows written before this migration have none (NULL: not known).
ALTER TABLE {schema}.audit ADD COLUMN db_role text;
ALTER TABLE {schema}.audit ALTER COLUMN db_role SET DEFAULT session_user;
