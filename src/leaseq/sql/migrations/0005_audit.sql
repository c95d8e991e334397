-- leaseq migration 0005: the audit log of operator actions.
--
-- Every operator call that changes jobs or a queue's settings (replay, cancel,
-- configure, pause; from the library, the CLI or the dashboard) writes one row
-- here in the same statement as its change, so the log never claims an action
-- that did not commit, nor misses one that did. Who: the actor the caller names
-- (the dashboard passes its user), else the database role. One row per action,
-- not per job: a bulk replay of 1,000 jobs is one row holding their ids.
CREATE TABLE {schema}.audit (
    audit_id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at timestamptz NOT NULL,
    actor text NOT NULL,
    action text NOT NULL,
    queue text,
    job_ids bigint[] NOT NULL DEFAULT '{}',
    detail jsonb NOT NULL DEFAULT '{}'
);
-- A queue's actions, newest first (the dashboard's filter); the whole log reads
-- the primary key backwards.
CREATE INDEX audit_queue_idx ON {schema}.audit (queue, audit_id);
