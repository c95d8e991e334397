-- A worker waits for wake-ups on these queues: enqueues of them notify from now
-- on (migration 0020). Moves the expiry on if the entries exist.
SELECT {schema}.waiter_enter(%(queues)s::text[], %(worker)s, %(seconds)s)
