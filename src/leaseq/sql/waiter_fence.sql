-- After waiter_enter committed: an id given after every producer's that may have
-- read "nobody waits" before the entry was visible (migration 0020). Its own
-- transaction ends at once.
SELECT pg_current_xact_id()::text
