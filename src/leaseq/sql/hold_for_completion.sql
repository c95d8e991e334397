-- The first statement of a caller's transaction that is to complete this claim
-- (leaseq.contrib's job_session and job_atomic blocks). A REPEATABLE READ or
-- SERIALIZABLE transaction reads one snapshot, and its completion's UPDATE of
-- the job's row is a serialization failure if another transaction changed that
-- row since: the worker renews the lease while the handler runs, so a block
-- that lasted past a renewal failed, on every attempt. There the row is locked
-- now, fenced as the completion is (no row: the lease is lost); the worker's
-- renewals skip a locked row, and the lease they renewed last holds until the
-- worker's own deadline. In READ COMMITTED nothing is locked: the completion
-- reads the newest row version, and the renewals go on during the block.
WITH held AS (
    SELECT j.job_id
    FROM {schema}.job AS j
    WHERE current_setting('transaction_isolation') IN ('repeatable read', 'serializable')
      AND j.job_id = %(job_id)s
      AND j.lease_version = %(lease_version)s
      AND j.lease_until > {schema}.clock()
    FOR NO KEY UPDATE
)
SELECT current_setting('transaction_isolation') IN ('repeatable read', 'serializable'),
       EXISTS (SELECT FROM held)
