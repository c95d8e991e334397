-- Every schedule with its bookkeeping, whether its queue is paused, and how many
-- seconds its next tick is past due by the database's clock.
SELECT s.name, s.queue, s.spec, s.tz, s.last_tick, s.next_tick, s.enqueued, s.skipped,
       s.paused, s.last_job_id, coalesce(q.paused, false),
       greatest(extract(epoch FROM {schema}.clock() - s.next_tick), 0)::float8
FROM {schema}.schedule AS s
LEFT JOIN {schema}.queue AS q ON q.name = s.queue
ORDER BY s.name
