-- Cancel a queued job, or skip a failed one (which unblocks its ordering key);
-- with %(running)s, also end a running job's claim through the lease fence;
-- with %(only_failed)s, only skip a failed job (re-checked on the locked row);
-- with %(lease_version)s, only while the job's lease_version is still that one
-- (as someone saw it: a job replayed since, maybe run and failed again, is left
-- as it is; re-checked on the locked row too).
-- A running job: status cancelled at once and lease_version moved on, so every
-- later write of the claim (renew, complete, retry, fail, release) is refused,
-- and its worker learns at its next renewal -- sooner, through a notification
-- ("!lost <job_id>": not a queue name) that makes it renew that lease now. The
-- history entry keeps the end of the lease cut short (cut_lease_until): a
-- replay waits until then (see replay.sql), and so does every job of its
-- ordering key (the hold job_key_leave writes, migration 0014), and so does its
-- concurrency slot (slot_hold, counted by the limited claims). One audit row
-- if it changed. A job someone waits for (result_awaited) names itself on the
-- results channel, as its completion or failure would.
WITH target AS (
    SELECT j.job_id, j.status FROM {schema}.job AS j WHERE j.job_id = %(job_id)s
),
cancelled AS (
    UPDATE {schema}.job AS j
    SET status = 'cancelled',
        finished_at = {schema}.clock(),
        lease_until = NULL,
        lease_version = j.lease_version + CASE WHEN j.status = 'running' THEN 1 ELSE 0 END,
        history = {schema}.history_append(j.history, jsonb_build_object(
            'attempt', j.attempts, 'at', {schema}.clock(), 'outcome', 'cancelled',
            'previous_status', j.status,
            'actor', coalesce(%(actor)s::text, session_user::text))
            || CASE WHEN j.status = 'running' THEN jsonb_build_object(
                   'lease_version', j.lease_version, 'claimed_at', j.claimed_at,
                   'cut_lease_until', j.lease_until)
               ELSE '{}'::jsonb END)
    FROM target AS t
    WHERE j.job_id = t.job_id
      AND (j.status IN ('queued', 'failed') OR (%(running)s AND j.status = 'running'))
      AND (j.status = 'failed' OR NOT %(only_failed)s)
      AND (%(lease_version)s::bigint IS NULL OR j.lease_version = %(lease_version)s::bigint)
    -- The status the row had when this UPDATE took it (its new history entry
    -- says), not the statement snapshot's: a claim that committed while the
    -- cancel waited for the row made a running job of a queued one.
    RETURNING j.job_id, j.queue, j.group_key, j.limited, j.result_awaited,
              j.history -> -1 ->> 'previous_status' AS previous_status,
              (j.history -> -1 ->> 'cut_lease_until')::timestamptz AS cut_lease_until
),
-- A lease cut short while live keeps its slot until it would have ended: its
-- handler may run until then. The job table's trigger job_slot_freed writes
-- that hold for a job marked `limited` (claimed under a concurrency limit, or
-- running when one was set); here it is written for the others, whose queue
-- had no limit when they started, so that a limit set later (or set by a
-- configure_queue racing their claim) counts the handler still running. Not
-- in the trigger: its WHEN is re-read by every status update (the hot path).
-- The reaper drops a hold once ended; a queue without limits never reads it.
held AS (
    INSERT INTO {schema}.slot_hold AS h (job_id, queue, group_key, until)
    SELECT c.job_id, c.queue, c.group_key, c.cut_lease_until
    FROM cancelled AS c
    WHERE c.previous_status = 'running' AND NOT c.limited
      AND c.cut_lease_until > {schema}.clock()
    ON CONFLICT (job_id) DO UPDATE
        SET queue = excluded.queue, group_key = excluded.group_key,
            until = greatest(h.until, excluded.until)
),
audit AS (
    INSERT INTO {schema}.audit (at, actor, action, queue, job_ids, detail)
    SELECT {schema}.clock(), coalesce(%(actor)s::text, session_user::text), 'cancel', c.queue,
           ARRAY[c.job_id], jsonb_build_object('previous_status', c.previous_status)
    FROM cancelled AS c
)
SELECT t.job_id, coalesce(cancelled.previous_status, t.status), cancelled.job_id IS NOT NULL AS changed,
       CASE WHEN cancelled.previous_status = 'running' AND %(channel)s::text IS NOT NULL
            THEN pg_notify(%(channel)s::text, '!lost ' || cancelled.job_id) END,
       -- Its waiters (wait_result marked it) learn now, not at their next look.
       CASE WHEN cancelled.result_awaited AND %(results_channel)s::text IS NOT NULL
            THEN pg_notify(%(results_channel)s::text, cancelled.job_id::text) END
FROM target AS t LEFT JOIN cancelled ON cancelled.job_id = t.job_id
