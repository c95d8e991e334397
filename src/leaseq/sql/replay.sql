-- Put failed or cancelled jobs (or failed ones only: the statuses asked for)
-- back in their queue with a fresh attempt budget.
-- A job keeps its id (so its idempotency key still matches) and its history.
-- lease_version moves on (fencing tokens only grow): no write of a claim from
-- before the replay can be taken for one of the replayed job's.
-- Targets: the jobs of %(job_ids)s, or a batch of up to %(limit)s failed jobs
-- of a queue (queue), oldest failure first, that failed by %(failed_before)s
-- (when given); the caller repeats until none is left. (Without that bound, a
-- job replayed by an earlier batch and failed again since came back in a later
-- one: replayed again and again as long as workers failed it.)
-- Admission: a queue with limits takes back only what fits in its backlog
-- (jobs and bytes, as admit() counts them); the rest is reported `refused`
-- and left as it is. A job whose payload is now larger than its queue takes
-- at all (max_payload_bytes, or its whole max_queued_bytes: lowered since it
-- was enqueued) can never be taken back, as admit() would refuse it now: it is
-- reported `too_large` (the limit's name; `limit_bytes` its value) and left as
-- it is, outside the room count, so it neither makes the jobs after it
-- `refused` nor stops a queue's batches (which leave it out, like held jobs). The UPDATE re-checks each row's status after locking it,
-- so concurrent replays never replay a job twice.
-- A job cancelled while running becomes claimable only once the lease that
-- the cancel cut short would have ended (its history entries keep that end):
-- by then its old handler has been told, so the replay never starts a second
-- run beside a first one that has not noticed yet.
-- One audit row per queue holds the replayed ids (none if nothing changed).
-- A unique job is `held` (left as it is) while another job of its queue holds
-- its key (unfinished, or done within its unique_for) or an earlier job of
-- this batch takes it: a replay never makes a second unfinished job of a key.
-- The batch of a queue leaves held jobs out, so it reaches the end. The
-- trigger job_unique_follow_status re-checks under the key's lock (LQ003).
-- %(lease_versions)s (NULL, or one per id of %(job_ids)s, which are then
-- distinct): the lease_version each job had when someone looked at it. A job
-- whose lease_version moved on since (replayed, run again, maybe failed again) is
-- `stale` and left alone, checked again on the locked row.
WITH shown AS (
    SELECT s.job_id, s.lease_version
    FROM unnest(%(job_ids)s::bigint[], %(lease_versions)s::bigint[]) AS s (job_id, lease_version)
    WHERE %(lease_versions)s::bigint[] IS NOT NULL
),
candidates AS (
    SELECT j.job_id, j.queue, j.status, j.payload_bytes, j.finished_at, j.unique_key, h.held,
           over.too_large, over.limit_bytes,
           shown.lease_version AS expected,
           coalesce(shown.lease_version <> j.lease_version, false) AS stale
    FROM {schema}.job AS j
    LEFT JOIN shown ON shown.job_id = j.job_id
    CROSS JOIN LATERAL (
        SELECT j.unique_key IS NOT NULL AND EXISTS (
            SELECT 1 FROM {schema}.job AS o
            WHERE o.queue = j.queue AND o.unique_key = j.unique_key AND o.unique_held
              AND o.job_id <> j.job_id
              AND NOT (o.status = 'done'
                       AND o.finished_at + make_interval(secs => o.unique_for) <= {schema}.clock()))
    ) AS h (held)
    -- The first limit the payload is over, in admit()'s order (none: NULLs).
    LEFT JOIN LATERAL (
        SELECT l.name, l.bytes
        FROM {schema}.queue AS q
        CROSS JOIN LATERAL (VALUES (1, 'max_payload_bytes', q.max_payload_bytes::bigint),
                                   (2, 'max_queued_bytes', q.max_queued_bytes))
            AS l (rank, name, bytes)
        WHERE q.name = j.queue AND j.payload_bytes > l.bytes
        ORDER BY l.rank
        LIMIT 1
    ) AS over (too_large, limit_bytes) ON true
    WHERE j.job_id = ANY(%(job_ids)s::bigint[])
       OR (j.queue = %(queue)s::text AND j.status = 'failed' AND NOT h.held
           AND over.too_large IS NULL
           AND (%(failed_before)s::timestamptz IS NULL
                OR j.finished_at <= %(failed_before)s::timestamptz))
    ORDER BY j.finished_at, j.job_id
    LIMIT %(limit)s
),
eligible AS (
    SELECT c.*,
           c.unique_key IS NOT NULL AND row_number() OVER (
               PARTITION BY c.queue, c.unique_key ORDER BY c.finished_at, c.job_id) > 1 AS twin
    FROM candidates AS c
    WHERE c.status = ANY(%(statuses)s::text[]) AND NOT c.held AND NOT c.stale
      AND c.too_large IS NULL
),
room AS (
    SELECT q.name,
           q.max_queued_jobs
               - (SELECT coalesce(sum(b.jobs), 0) FROM {schema}.backlog AS b WHERE b.queue = q.name)
               AS jobs,
           q.max_queued_bytes
               - (SELECT coalesce(sum(b.bytes), 0) FROM {schema}.backlog AS b WHERE b.queue = q.name)
               AS bytes
    FROM {schema}.queue AS q
    WHERE q.name IN (SELECT c.queue FROM candidates AS c) AND q.counts_backlog
),
ranked AS (
    SELECT c.job_id, c.queue, c.expected,
           row_number() OVER w AS position,
           sum(c.payload_bytes) OVER w AS bytes
    FROM eligible AS c
    WHERE NOT c.twin
    WINDOW w AS (PARTITION BY c.queue ORDER BY c.finished_at, c.job_id)
),
admitted AS (
    SELECT r.job_id, r.expected
    FROM ranked AS r LEFT JOIN room ON room.name = r.queue
    WHERE (room.jobs IS NULL OR r.position <= room.jobs)
      AND (room.bytes IS NULL OR r.bytes <= room.bytes)
),
replayed AS (
    UPDATE {schema}.job AS j
    SET status = 'queued',
        attempts = 0,
        lease_version = j.lease_version + 1,
        -- Every cut lease of its history, not only its last entry's: a replay
        -- cancelled while queued (no lease cut) and replayed again still waits.
        available_at = greatest({schema}.clock(), (
            SELECT max((entry ->> 'cut_lease_until')::timestamptz)
            FROM jsonb_array_elements(j.history) AS entry)),
        finished_at = NULL,
        -- Counted in the backlog from now on if its queue counts (the trigger
        -- job_backlog_count adds it).
        counted = j.counted OR EXISTS (SELECT 1 FROM room WHERE room.name = j.queue),
        history = {schema}.history_append(j.history, jsonb_build_object(
            'attempt', j.attempts, 'at', {schema}.clock(), 'outcome', 'replayed',
            'previous_status', j.status,
            'actor', coalesce(%(actor)s::text, session_user::text)))
    FROM admitted AS a
    WHERE j.job_id = a.job_id AND j.status = ANY(%(statuses)s::text[])
      AND (a.expected IS NULL OR j.lease_version = a.expected)
    RETURNING j.job_id, j.queue
),
audit AS (
    INSERT INTO {schema}.audit (at, actor, action, queue, job_ids)
    SELECT {schema}.clock(), coalesce(%(actor)s::text, session_user::text), 'replay', r.queue,
           array_agg(r.job_id ORDER BY r.job_id)
    FROM replayed AS r
    GROUP BY r.queue
)
SELECT c.job_id, c.status,
       replayed.job_id IS NOT NULL AS changed,
       c.status = ANY(%(statuses)s::text[]) AND admitted.job_id IS NULL
           AND NOT (c.held OR c.stale OR coalesce(e.twin, false) OR c.too_large IS NOT NULL)
           AS refused,
       c.held OR coalesce(e.twin, false) AS held,
       CASE WHEN c.status = ANY(%(statuses)s::text[]) AND NOT c.stale THEN c.too_large END
           AS too_large,
       c.limit_bytes, c.payload_bytes
FROM candidates AS c
LEFT JOIN eligible AS e ON e.job_id = c.job_id
LEFT JOIN replayed ON replayed.job_id = c.job_id
LEFT JOIN admitted ON admitted.job_id = c.job_id
ORDER BY c.job_id
