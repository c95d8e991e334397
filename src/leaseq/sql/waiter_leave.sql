-- A worker no longer waits for wake-ups on these queues (its claims of them come
-- back full, or it stops): their enqueues stop notifying for it.
SELECT {schema}.waiter_leave(%(queues)s::text[], %(worker)s)
