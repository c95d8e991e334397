-- A waiting worker moves its entries' expiry on; the queues it still has one for.
SELECT q FROM {schema}.waiter_refresh(%(worker)s, %(seconds)s) AS q
