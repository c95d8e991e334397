-- Take one schedule if its next tick is due and no other worker holds it (SKIP
-- LOCKED: that worker is handling it now); the lock lasts until the caller's
-- transaction ends. With the database's clock and whether the queue is paused.
-- Only as this worker declared it: a worker of another version (a rolling
-- deploy) would compute the ticks of its own spec from the row's next tick, of
-- the other spec, and lose or misplace them. The row is the last declaration's.
SELECT s.next_tick, {schema}.clock(), coalesce(q.paused, false)
FROM {schema}.schedule AS s
LEFT JOIN {schema}.queue AS q ON q.name = s.queue
WHERE s.name = %(name)s AND s.next_tick <= {schema}.clock()
  AND (s.queue, s.spec, s.tz) = (%(queue)s, %(spec)s, %(tz)s)
FOR UPDATE OF s SKIP LOCKED
