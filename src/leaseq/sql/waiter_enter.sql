-- A worker waits for wake-ups on these queues: from now on their enqueues notify
-- (admit(), migration 0020). Its entry in each queue's row says until when
-- (epoch seconds); made again, it moves on. A queue without a row gets one, as
-- its first enqueue would make it: else the first job of a queue a worker waits
-- on before anything used it would be found only at the worker's poll.
INSERT INTO {schema}.queue AS q (name, waiting)
SELECT n, jsonb_build_object(%(worker)s::text,
                             extract(epoch FROM {schema}.clock()) + %(seconds)s::double precision)
FROM unnest(%(queues)s::text[]) AS n
ON CONFLICT (name) DO UPDATE SET waiting = q.waiting || excluded.waiting
