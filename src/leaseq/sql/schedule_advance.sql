-- After a worker handled a schedule's due ticks (it holds the row's lock):
-- the latest tick handled, the next one due, what was enqueued, skipped or
-- passed while paused; and the tick rows older than a day go.
WITH pruned AS (
    DELETE FROM {schema}.schedule_tick AS t
    WHERE t.ctid = ANY (ARRAY(
        SELECT o.ctid FROM {schema}.schedule_tick AS o
        WHERE o.schedule = %(name)s AND o.tick_at < %(last_tick)s - interval '1 day'
        LIMIT 1000))
)
UPDATE {schema}.schedule AS s
SET last_tick = %(last_tick)s,
    next_tick = %(next_tick)s,
    enqueued = s.enqueued + %(enqueued)s,
    skipped = s.skipped + %(skipped)s,
    paused = s.paused + %(paused)s,
    last_job_id = coalesce(%(last_job_id)s::bigint, s.last_job_id),
    updated_at = statement_timestamp()
WHERE s.name = %(name)s
