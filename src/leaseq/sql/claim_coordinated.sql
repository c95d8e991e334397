-- Whether a claim of the queue goes through claim_limited() (migration 0009):
-- the queue has limits, or grouped queued jobs. The same test as claim.sql's
-- `coordinated`: for such a queue the plain branches of the claim never run,
-- and EXPLAIN does not show the function's own queries.
SELECT q.has_limits OR EXISTS (SELECT 1 FROM {schema}.job AS g
                               WHERE g.queue = %(queue)s AND g.status = 'queued'
                                 AND NOT g.blocked AND g.group_key IS NOT NULL)
FROM {schema}.queue AS q
WHERE q.name = %(queue)s
