-- Remove a schedule the app no longer declares: its row, its tick rows (no
-- later tick of it would remove them) and one audit row, in one statement. A
-- worker still running with it declared no longer finds it due; one that starts
-- with it declares it again, from its next tick (so no old tick fires again).
WITH removed AS (
    DELETE FROM {schema}.schedule WHERE name = %(name)s
    RETURNING name, queue, spec, tz
),
ticks AS (
    DELETE FROM {schema}.schedule_tick AS t USING removed WHERE t.schedule = removed.name
),
audit AS (
    INSERT INTO {schema}.audit (at, actor, action, queue, detail)
    SELECT {schema}.clock(), coalesce(%(actor)s::text, session_user::text), 'remove_schedule',
           removed.queue,
           jsonb_build_object('schedule', removed.name, 'spec', removed.spec, 'tz', removed.tz)
    FROM removed
)
SELECT count(*) FROM removed
