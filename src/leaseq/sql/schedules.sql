-- Every schedule with its bookkeeping, and whether its queue is paused.
SELECT s.name, s.queue, s.spec, s.tz, s.last_tick, s.next_tick, s.enqueued, s.skipped,
       s.paused, s.last_job_id, coalesce(q.paused, false)
FROM {schema}.schedule AS s
LEFT JOIN {schema}.queue AS q ON q.name = s.queue
ORDER BY s.name
