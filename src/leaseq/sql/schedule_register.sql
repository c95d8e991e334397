-- Declare (or update) the schedules of an app: a new schedule starts with its
-- first tick after now; a changed spec or time zone starts over the same way
-- (its old ticks mean nothing to the new spec); an unchanged one keeps its
-- bookkeeping, so a restart misses nothing.
INSERT INTO {schema}.schedule AS s (name, queue, spec, tz, next_tick)
SELECT d.name, d.queue, d.spec, d.tz, d.first_tick
FROM unnest(%(names)s::text[], %(queues)s::text[], %(specs)s::text[], %(tzs)s::text[],
            %(first_ticks)s::timestamptz[]) AS d (name, queue, spec, tz, first_tick)
ON CONFLICT (name) DO UPDATE
SET queue = excluded.queue,
    spec = excluded.spec,
    tz = excluded.tz,
    next_tick = CASE WHEN (s.spec, s.tz) = (excluded.spec, excluded.tz) THEN s.next_tick
                     ELSE excluded.next_tick END,
    updated_at = statement_timestamp()
WHERE (s.queue, s.spec, s.tz) IS DISTINCT FROM (excluded.queue, excluded.spec, excluded.tz)
