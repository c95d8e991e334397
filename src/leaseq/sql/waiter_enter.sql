-- A worker waits for wake-ups on these queues: from now on their enqueues notify
-- (admit(), migration 0020). Its entry in each queue's row says until when
-- (epoch seconds); made again, it moves on. The queues entered come back: a
-- queue without a row (never enqueued to nor configured) gets none from a
-- worker (a mistyped name would show as a queue, and a producer in a REPEATABLE
-- READ transaction begun before the row was made could not enqueue): its first
-- enqueue makes the row, and the worker finds that job at its poll.
UPDATE {schema}.queue AS q
SET waiting = q.waiting || jsonb_build_object(
        %(worker)s::text, extract(epoch FROM {schema}.clock()) + %(seconds)s::double precision)
WHERE q.name = ANY (%(queues)s::text[])
RETURNING q.name
