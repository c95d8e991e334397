-- Whether this claim's completion has committed: asked, in the caller's
-- transaction, after a strict completion (complete.sql) matched nothing and
-- its snapshot did not show the job done by this claim. That snapshot is the
-- statement's own, taken before it waited for the row's lock: a first run of
-- the same transaction that committed meanwhile made the UPDATE, which reads
-- the newest row version, miss, but is not in it. In READ COMMITTED this
-- statement has a snapshot of its own, taken now, and sees that completion.
-- (In REPEATABLE READ and SERIALIZABLE the waiting UPDATE fails instead, with
-- a serialization failure: the transaction is tried again, and the next run's
-- snapshot shows the job done.)
-- A job that retention has moved to the archive since is found there.
SELECT EXISTS (
    SELECT FROM {schema}.job
    WHERE job_id = %(job_id)s
      AND lease_version = %(lease_version)s
      AND status = 'done'
) OR EXISTS (
    SELECT FROM {schema}.job_archive
    WHERE job_id = %(job_id)s
      AND lease_version = %(lease_version)s
      AND status = 'done'
)
