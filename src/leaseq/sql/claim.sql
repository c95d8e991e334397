-- Claim up to %(limit)s jobs of one queue: expired leases first (crash
-- recovery), then ready jobs in priority order. Each branch reads the head of
-- its own partial index under FOR UPDATE SKIP LOCKED with a LIMIT, so
-- concurrent claimers never wait for, nor take, each other's rows.
-- The ready index holds unordered jobs and the heads of ordering keys only
-- (a key's waiting jobs are `blocked`, outside it), so the claim never walks
-- a key's backlog. A head is claimable while no job of its key runs and no
-- earlier job of its key is unfinished (a failed one counts under 'block');
-- the unique index job_running_key_idx turns a race lost on a snapshot into
-- an error the caller retries, never two running jobs of one key. An expired
-- lease is the key's running job: recovering it keeps the key's order, unless
-- an earlier job of its key committed while it ran (a slow producer): only the
-- earliest unfinished job of a key is eligible, on recovery too. `stale` hands
-- each expired lease picked to lease_requeue() (migration 0012), which puts
-- such a job back behind the earlier one in a statement of its own; the claim
-- leaves it out, and a marker row (4) tells the client to claim again, since
-- the earlier job became the head after this statement's snapshot.
-- A last row with a NULL job_id says that repair notes of this queue are due
-- (see key_repair_run): the client acts on them in a statement of its own.
-- Each claim also says whether it recovered an expired lease and when the job
-- became claimable (its available_at, or the expired lease's end): the wait
-- until claimed_at, both database times, is what the metrics report. And it
-- carries the producer's trace context, which the worker's span continues,
-- and the job's own timeout (NULL: its task's).
-- A queue with limits (max_running, rate_limit and their per-group twins) or
-- with grouped queued jobs (deferred ones too: it makes those due ready,
-- migrations 0017 and 0022) is picked by claim_limited() (migration 0009), which
-- enforces the limits and takes the groups in turns; its picks are claimed by
-- the same UPDATE, and a last row with a NULL job_id says when a limit held
-- the claim back. The plain branches then never run: their one-time filter is
-- false, so neither index is read. Grouped jobs are not in job_ready_idx.
-- The queue is compared with the parameter, not with settings.name: only a
-- constant lets the planner read the index in order and stop at the LIMIT.
-- The ready jobs are read one priority at a time (`priorities`, a skip scan of
-- job_ready_idx: one probe per priority the queue holds, taken only while the
-- LIMIT is not met): within one priority, `available_at <= clock()` bounds the
-- index range, so the jobs that wait (a delay, a retry's backoff) are never
-- read. Read across priorities at once, that bound held for none but the
-- first, and a claim that found fewer ready jobs than it asked for walked
-- every waiting job of the queue (a million delayed jobs: 5,000 pages a claim).
WITH RECURSIVE settings AS (
    SELECT q.name, coalesce(%(lease)s::float8, q.lease_seconds) AS lease,
           q.ordering_policy = 'block' AS failed_blocks,
           q.has_limits OR EXISTS (SELECT 1 FROM {schema}.job AS g
                          WHERE g.queue = %(queue)s AND g.status = 'queued' AND NOT g.blocked
                            AND g.group_key IS NOT NULL) AS coordinated
    FROM {schema}.queue AS q
    WHERE q.name = %(queue)s AND NOT q.paused
),
expired AS (
    SELECT j.job_id, j.lease_until AS ready_at
    FROM {schema}.job AS j, settings AS s
    WHERE j.queue = %(queue)s
      AND j.status = 'running'
      AND j.lease_until <= {schema}.clock()
      AND j.attempts < j.max_attempts
      AND NOT (SELECT coordinated FROM settings)
    ORDER BY j.lease_until, j.job_id
    LIMIT %(limit)s
    FOR UPDATE OF j SKIP LOCKED
),
priorities AS (
    (SELECT j.priority FROM {schema}.job AS j
     WHERE j.queue = %(queue)s AND j.status = 'queued' AND NOT j.blocked
       AND j.group_key IS NULL AND NOT (SELECT coordinated FROM settings)
     ORDER BY j.priority DESC
     LIMIT 1)
    UNION ALL
    SELECT (SELECT j.priority FROM {schema}.job AS j
            WHERE j.queue = %(queue)s AND j.status = 'queued' AND NOT j.blocked
              AND j.group_key IS NULL AND j.priority < p.priority
            ORDER BY j.priority DESC
            LIMIT 1)
    FROM priorities AS p
    WHERE p.priority IS NOT NULL
),
ready AS (
    SELECT at_priority.job_id, at_priority.ready_at
    FROM priorities AS p
    CROSS JOIN LATERAL (
        SELECT j.job_id, j.available_at AS ready_at
        FROM {schema}.job AS j
        WHERE j.queue = %(queue)s
          AND j.status = 'queued'
          AND NOT j.blocked
          AND j.group_key IS NULL
          AND j.priority = p.priority
          AND j.available_at <= {schema}.clock()
          AND j.attempts < j.max_attempts
          -- Each test is a LIMIT 1 probe of one index (never a scan that the
          -- planner might hash or run sequentially): O(1) whatever a key holds.
          AND (j.ordering_key IS NULL OR (
              (SELECT r.job_id FROM {schema}.job AS r
               WHERE r.queue = j.queue AND r.ordering_key = j.ordering_key
                 AND r.status = 'running'
               LIMIT 1) IS NULL
              AND (SELECT e.job_id FROM {schema}.job AS e
                   WHERE e.queue = j.queue AND e.ordering_key = j.ordering_key
                     AND e.status IN ('queued', 'running')
                   ORDER BY e.ordering_seq, e.job_id
                   LIMIT 1) = j.job_id
              -- (the policy through a sub-select: a qual of j alone is evaluated
              -- once, in the index scan, not again in a join filter)
              AND NOT ((SELECT failed_blocks FROM settings) AND (
                  SELECT f.ordering_seq FROM {schema}.job AS f
                  WHERE f.queue = j.queue AND f.ordering_key = j.ordering_key
                    AND f.status = 'failed'
                    AND (f.ordering_seq, f.job_id) < (j.ordering_seq, j.job_id)
                  ORDER BY f.ordering_seq, f.job_id
                  LIMIT 1) IS NOT NULL)))
        ORDER BY j.available_at, j.job_id
        LIMIT %(limit)s
        FOR UPDATE OF j SKIP LOCKED
    ) AS at_priority
    -- (priorities come highest first: the rows are in claim order)
    LIMIT %(limit)s
),
coordinated AS (
    SELECT c.*
    FROM settings AS s, LATERAL {schema}.claim_limited(s.name, %(limit)s) AS c
    WHERE s.coordinated
),
picked AS (
    (SELECT job_id, 0 AS branch, ready_at, false AS limited FROM expired)
    UNION ALL
    (SELECT job_id, 1, ready_at, false FROM ready)  -- (named by the first branch)
    UNION ALL
    (SELECT job_id, branch, ready_at, limited FROM coordinated WHERE job_id IS NOT NULL)
    LIMIT %(limit)s
),
-- (Read from the recovering branches, every row of which is picked, not from
-- `picked`: a second reader would materialize it, and its rows would be locked
-- apart from their update, which reads their pages twice.)
stale AS (
    SELECT job_id
    FROM (SELECT job_id FROM expired UNION ALL SELECT job_id FROM coordinated WHERE branch = 0) AS p
    WHERE {schema}.lease_requeue(job_id)
),
claimed AS (
    UPDATE {schema}.job AS j
    SET status = 'running',
        lease_seconds = s.lease,
        lease_until = {schema}.clock() + make_interval(secs => s.lease),
        lease_version = j.lease_version + 1,
        attempts = j.attempts + 1,
        -- A coordinated claim waited for its queue's turn before it picked (its
        -- rate windows are reckoned from then): it is stamped with that time,
        -- not with the statement's start, or its starts would show earlier
        -- than its window allowed them.
        claimed_at = {schema}.clock()
            + (clock_timestamp() - statement_timestamp()) * s.coordinated::int,
        limited = picked.limited,
        history = CASE WHEN j.status = 'running'
            THEN {schema}.attempt_ended(j.history, j.attempts, j.lease_version, j.claimed_at,
                                        j.lease_until, j.lease_seconds, 'lease_expired')
            ELSE j.history END
    FROM picked, settings AS s
    WHERE j.job_id = picked.job_id AND j.job_id NOT IN (TABLE stale)
    RETURNING j.job_id, j.queue, j.payload, j.lease_version, j.attempts, j.max_attempts,
        j.ordering_key, j.ordering_seq, j.lease_until, j.lease_seconds, j.idempotency_key,
        picked.branch, j.priority, j.available_at, picked.ready_at, j.claimed_at,
        j.trace_context, j.timeout_seconds, j.group_key
)
-- In claim order: recovered leases first, then by priority, age and id; then
-- the markers (NULL job_id): 2, repair notes are due; 3, a limit held the
-- claim back (`wait`: seconds until a rate window has room; NULL: until a
-- running job of the queue ends); 4, a recovered lease was put back behind an
-- earlier job of its key, the key's head now: claim again; 5, deferred grouped
-- jobs came due and were made ready by this statement, too late for its own
-- UPDATE: claim again.
SELECT r.job_id, r.queue, r.payload, r.lease_version, r.attempts, r.max_attempts,
       r.ordering_key, r.ordering_seq, r.lease_until, r.lease_seconds, r.idempotency_key,
       r.branch = 0, r.ready_at, r.claimed_at, r.trace_context, r.timeout_seconds,
       r.group_key, r.branch, r.wait
FROM (
    SELECT claimed.*, NULL::float8 AS wait FROM claimed
    UNION ALL
    SELECT NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, m.branch, NULL,
        NULL, NULL, NULL, NULL, NULL, NULL, m.wait
    FROM (
        SELECT 2 AS branch, NULL::float8 AS wait
        WHERE EXISTS (
            SELECT 1 FROM {schema}.key_repair AS k
            WHERE k.queue = %(queue)s AND k.next_check <= {schema}.clock())
        UNION ALL
        SELECT c.branch, c.wait FROM coordinated AS c WHERE c.job_id IS NULL
        UNION ALL
        (SELECT 4, NULL FROM stale LIMIT 1)
    ) AS m
) AS r
ORDER BY r.branch, r.priority DESC, r.available_at, r.job_id
