-- Act on the due repair notes of one queue (a claim said some are due): each
-- settles an ordering key again now that the producers it waited for may be
-- over. Returns how many notes were settled for good.
SELECT {schema}.key_repair_run(%(queue)s, %(limit)s)
