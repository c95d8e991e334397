-- Give a batch of unfinished claims back at once (graceful shutdown), each
-- fenced by (job_id, lease_version) and a live lease. The interrupted attempt
-- is not counted: shutting workers down must not use up a job's budget. A claim
-- whose handler still runs (a thread that cannot be stopped, told through its
-- lost flag) is queued to run again only once its lease would have ended, so
-- no other worker starts the job beside it.
-- A release this claim already committed (a resend after an ambiguous commit)
-- is accepted: matched by the UPDATE itself while it is the row's last write,
-- else found in the history; either way it changes nothing.
-- A live lease is tested as `lease_until > clock()` alone: only a running job
-- has a lease (job_check1), and without `status = 'running'` the partial lease
-- index is no candidate, so each claim is found by its primary key even when
-- stale statistics say one job runs while thousands do (a renewal of 10 leases
-- with 5,000 running read the whole lease index 10 times: 17 ms).
WITH claimed AS (
    SELECT *
    FROM unnest(%(job_ids)b::bigint[], %(lease_versions)b::bigint[],
                %(handlers_running)s::boolean[])
        AS c (job_id, lease_version, handler_running)
),
released AS (
    UPDATE {schema}.job AS j
    SET status = 'queued',
        lease_until = NULL,
        available_at = CASE
            WHEN j.status <> 'running' THEN j.available_at
            WHEN c.handler_running THEN greatest({schema}.clock(), j.lease_until)
            ELSE {schema}.clock() END,
        attempts = CASE WHEN j.status = 'running' THEN greatest(j.attempts - 1, 0) ELSE j.attempts END,
        history = CASE WHEN j.status = 'running'
            THEN {schema}.history_append(j.history, jsonb_build_object(
                'attempt', j.attempts, 'at', {schema}.clock(), 'outcome', 'released',
                'write', 'release', 'lease_version', j.lease_version,
                'claimed_at', j.claimed_at, 'renewed_at', j.lease_until - make_interval(secs => j.lease_seconds))
                -- Its handler runs on: the lease's end, which a replay after a
                -- cancel of the released job waits for too (see replay.sql).
                || CASE WHEN c.handler_running
                        THEN jsonb_build_object('cut_lease_until', j.lease_until)
                        ELSE '{}'::jsonb END)
            ELSE j.history END
    FROM claimed AS c
    WHERE j.job_id = c.job_id
      AND j.lease_version = c.lease_version
      AND (j.lease_until > {schema}.clock()
           OR (j.status = 'queued'
               AND j.history -> -1 @> jsonb_build_object(
                   'write', 'release', 'lease_version', c.lease_version)))
    RETURNING j.job_id, j.queue, j.group_key, j.limited, j.available_at, c.handler_running
),
-- A keyed job whose handler runs on holds its key until its lease would have
-- ended (key_hold, written by the job table's trigger job_key_leave, 0014).
-- And its concurrency slot (slot_hold): the trigger job_slot_freed writes that
-- hold for a job marked `limited`; here it is written for the others, whose
-- queue had no limit when they started, so that a limit set later (or by a
-- configure_queue racing their claim) counts the handler still running (see
-- cancel.sql). Only a release whose handler runs on writes it.
held AS (
    INSERT INTO {schema}.slot_hold AS h (job_id, queue, group_key, until)
    SELECT r.job_id, r.queue, r.group_key, r.available_at
    FROM released AS r
    WHERE r.handler_running AND NOT r.limited AND r.available_at > {schema}.clock()
    ON CONFLICT (job_id) DO UPDATE
        SET queue = excluded.queue, group_key = excluded.group_key,
            until = greatest(h.until, excluded.until)
)
-- Rows as every fenced batch write returns them (see complete.sql): one per
-- job this statement changed (written), then one per claim as the statement's
-- snapshot saw it: accepted when this claim's own release had committed before
-- (a resend). A written row wins.
SELECT released.job_id, true AS written, true AS accepted
FROM released
UNION ALL
SELECT c.job_id, false,
       coalesce(before.history @> jsonb_build_array(
           jsonb_build_object('write', 'release', 'lease_version', c.lease_version)), false)
FROM claimed AS c
{fragment:claimed_job_as_seen}
