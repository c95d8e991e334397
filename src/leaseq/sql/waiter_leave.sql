-- A worker no longer waits for wake-ups on these queues (its claims of them come
-- back full, or it stops): their enqueues stop notifying for it.
UPDATE {schema}.queue AS q
SET waiting = q.waiting - %(worker)s::text
WHERE q.name = ANY (%(queues)s::text[]) AND q.waiting ? %(worker)s::text
