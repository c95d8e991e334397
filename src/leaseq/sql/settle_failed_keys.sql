-- After a change of a queue's ordering policy: settle every key of the queue
-- that has a failed job (a failed head holds its key under 'block' only).
SELECT {schema}.key_settle(k.queue, k.ordering_key)
FROM (
    SELECT DISTINCT j.queue, j.ordering_key
    FROM {schema}.job AS j
    WHERE j.queue = %(name)s AND j.status = 'failed' AND j.ordering_key IS NOT NULL
) AS k
WHERE %(set_ordering_policy)s
