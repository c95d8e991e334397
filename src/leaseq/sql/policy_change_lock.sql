-- Before a change of a queue's ordering policy: the shared lock of every key
-- bucket, as a producer of each of them, held until the change commits.
-- A settler reads the policy committed when it settles a key: one that ran
-- before the change committed, with the old policy, could not be seen by
-- settle_failed_keys.sql if its own commit came later (a head failed under
-- 'block' while the queue turned to 'continue': its key stayed stuck for ever).
-- With these locks taken first, a settler that already holds a bucket is
-- waited for here (its key is then in the snapshot of settle_failed_keys.sql,
-- a later statement), and one that comes after fails its try of the bucket's
-- exclusive lock and leaves a repair note, which is acted on once the change
-- has committed (key_repair_run needs that lock too). Settlers only ever try
-- these locks, so this waits for the transactions in flight, never deadlocks.
SELECT count(pg_advisory_xact_lock_shared({schema}.key_lock_class(), b.bucket))
FROM generate_series(0, 255) AS b (bucket)
WHERE %(set_ordering_policy)s
