-- A waiting worker moves its entries on; the queues it still has one in (one the
-- reaper removed while the worker was cut off is entered again by the worker).
UPDATE {schema}.queue AS q
SET waiting = q.waiting || jsonb_build_object(
        %(worker)s::text, extract(epoch FROM {schema}.clock()) + %(seconds)s::double precision)
WHERE q.name = ANY (%(queues)s::text[]) AND q.waiting ? %(worker)s::text
RETURNING q.name
