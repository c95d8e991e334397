-- Take one schedule if its next tick is due and no other worker holds it (SKIP
-- LOCKED: that worker is handling it now); the lock lasts until the caller's
-- transaction ends. With the database's clock and whether the queue is paused.
SELECT s.next_tick, {schema}.clock(), coalesce(q.paused, false)
FROM {schema}.schedule AS s
LEFT JOIN {schema}.queue AS q ON q.name = s.queue
WHERE s.name = %(name)s AND s.next_tick <= {schema}.clock()
FOR UPDATE OF s SKIP LOCKED
