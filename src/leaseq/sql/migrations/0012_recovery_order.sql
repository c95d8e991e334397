-- leaseq migration 0012: on lease recovery too, only the earliest unfinished
-- job of a key is eligible (DESIGN, per-key ordering).
--
-- Before: an expired lease of a key's running job was recovered before
-- anything else of its key, even when an earlier job of the key had committed
-- while it ran (a slow producer): the later job ran again ahead of the earlier
-- one.
--
-- Now the claim hands every expired lease it picked to lease_requeue(). A
-- keyed one that is no longer its key's earliest unfinished job is put back,
-- queued and blocked (its crashed attempt counted, its lease version moved
-- on); settling its key (the job table's triggers, at the end of that UPDATE)
-- makes the earlier job the head. The claim leaves such a job out of what it
-- claims and says so (a marker row): the client claims again, and the earlier
-- job runs. plpgsql, so that the UPDATE runs on a statement of its own: the
-- claim's own UPDATE never touches the same row, and the triggers that settle
-- the key fire for it (one UPDATE of `job` per query keeps only one statement
-- trigger event).
--
-- attempt_ended() appends the history entry of an attempt that ended, written
-- once for the claim (a recovered lease), the reaper and lease_requeue(): a
-- SQL expression, which the planner inlines.

CREATE FUNCTION {schema}.attempt_ended(
    p_history jsonb, p_attempt integer, p_lease_version bigint, p_claimed_at timestamptz,
    p_lease_until timestamptz, p_lease_seconds double precision, p_outcome text,
    p_extra jsonb DEFAULT '{}')
    RETURNS jsonb
    LANGUAGE sql STABLE PARALLEL SAFE
    AS $$ SELECT {schema}.history_append(p_history, jsonb_build_object(
        'attempt', p_attempt, 'at', {schema}.clock(), 'outcome', p_outcome,
        'lease_version', p_lease_version, 'claimed_at', p_claimed_at,
        'renewed_at', p_lease_until - make_interval(secs => p_lease_seconds)) || p_extra) $$;

-- Whether the claim must not recover job p_job_id, whose expired lease it
-- picked, because it was put back behind an earlier job of its key. The
-- conditions are read again on the row, locked: a lease renewed, a job
-- finished or not keyed is left to the claim.
CREATE FUNCTION {schema}.lease_requeue(p_job_id bigint) RETURNS boolean
    LANGUAGE plpgsql
    AS $$
BEGIN
    UPDATE {schema}.job AS j
    SET status = 'queued',
        blocked = true,
        available_at = {schema}.clock(),
        lease_until = NULL,
        lease_version = j.lease_version + 1,
        limited = false,
        history = {schema}.attempt_ended(j.history, j.attempts, j.lease_version, j.claimed_at,
            j.lease_until, j.lease_seconds, 'lease_expired',
            jsonb_build_object('requeued', 'behind an earlier job of its key'))
    WHERE j.job_id = p_job_id
      AND j.ordering_key IS NOT NULL
      AND j.status = 'running'
      AND j.lease_until <= {schema}.clock()
      AND (SELECT e.job_id FROM {schema}.job AS e
           WHERE e.queue = j.queue AND e.ordering_key = j.ordering_key
             AND e.status IN ('queued', 'running')
           ORDER BY e.ordering_seq, e.job_id
           LIMIT 1) <> j.job_id;
    RETURN FOUND;
END
$$;
