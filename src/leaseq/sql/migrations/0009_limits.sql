-- leaseq migration 0009: concurrency and rate limits, groups, and fair share.
--
-- A job may carry a group (a tenant, a customer). A queue may limit its
-- running jobs (max_running), its running jobs per group
-- (max_running_per_group), its starts per period (rate_limit / rate_period)
-- and its starts per period per group. The claim enforces all of them, in the
-- database, for every worker at once, and takes groups in turns, so a group
-- with 100,000 queued jobs does not starve a group with 10.
--
-- How (docs/architecture.md, "Limits, groups and fair share"):
-- * Grouped jobs leave the ready index for an index of their own, ordered by
--   group, so the claim can visit the groups one after the other and skip a
--   saturated one at the cost of one probe, never a walk of its jobs.
-- * A queue with limits or with grouped ready jobs is claimed by
--   claim_limited(), which first locks the queue's row of claim_turn: such
--   claims take turns. plpgsql, so every query after that lock runs on a fresh
--   snapshot and sees every claim committed before it: a count of the running
--   jobs is then exact (under a plain statement's snapshot it could miss a
--   claim that committed while it waited, and overshoot).
-- * Running jobs are counted by live lease (lease_until > clock()): an expired
--   lease never holds a slot, and a finish frees its slot at its commit.
-- * A rate limit is a sliding window: the starts of the last period, kept as
--   (time, count) pairs, so that no window of one period ever holds more than
--   the limit (a token bucket would let twice the limit through).
-- * A job claimed under a concurrency limit is `limited`; when it stops
--   running its queue's name is sent on the schema's channel, so that a worker
--   whose claim found the limit reached asks again at once.
--
-- Adding the columns rewrites nothing. The ready index is rebuilt once, with
-- the same entries (no job has a group yet).

ALTER TABLE {schema}.job
    ADD COLUMN group_key text CHECK (octet_length(group_key) <= 255),
    ADD COLUMN limited boolean NOT NULL DEFAULT false;
ALTER TABLE {schema}.job_archive
    ADD COLUMN group_key text,
    ADD COLUMN limited boolean NOT NULL DEFAULT false;

ALTER TABLE {schema}.queue
    ADD COLUMN max_running integer CHECK (max_running > 0),
    ADD COLUMN max_running_per_group integer CHECK (max_running_per_group > 0),
    ADD COLUMN rate_limit integer CHECK (rate_limit > 0),
    ADD COLUMN rate_period double precision CHECK (rate_period > 0),
    ADD COLUMN rate_limit_per_group integer CHECK (rate_limit_per_group > 0),
    ADD COLUMN rate_period_per_group double precision CHECK (rate_period_per_group > 0),
    ADD CHECK ((rate_limit IS NULL) = (rate_period IS NULL)),
    ADD CHECK ((rate_limit_per_group IS NULL) = (rate_period_per_group IS NULL));
-- Whether claims of the queue go through claim_limited().
ALTER TABLE {schema}.queue ADD COLUMN has_limits boolean GENERATED ALWAYS AS (
    max_running IS NOT NULL OR max_running_per_group IS NOT NULL
    OR rate_limit IS NOT NULL OR rate_limit_per_group IS NOT NULL) STORED;

-- Ungrouped ready jobs only: the plain claim's index, as before.
CREATE INDEX job_ready_ungrouped_idx ON {schema}.job (queue, priority DESC, available_at, job_id)
    WHERE status = 'queued' AND NOT blocked AND group_key IS NULL;
DROP INDEX {schema}.job_ready_idx;
ALTER INDEX {schema}.job_ready_ungrouped_idx RENAME TO job_ready_idx;

-- Grouped ready jobs by group, each group's in the claim's order: the claim
-- finds the next group with one probe and reads that group's head.
CREATE INDEX job_group_ready_idx
    ON {schema}.job (queue, group_key, priority DESC, available_at, job_id)
    WHERE status = 'queued' AND NOT blocked AND group_key IS NOT NULL;

-- A group's running jobs by lease: its live ones are counted against
-- max_running_per_group.
CREATE INDEX job_group_running_idx ON {schema}.job (queue, group_key, lease_until)
    WHERE status = 'running' AND group_key IS NOT NULL;

-- One row per queue claimed by claim_limited(): the lock its claims take turns
-- on, whose turn is next (the group served last; NULL: the ungrouped jobs, or
-- nobody yet, so the first group is next), and the starts of the last rate
-- period (started_n[i] jobs at started_at[i], oldest first).
CREATE TABLE {schema}.claim_turn (
    queue text PRIMARY KEY,
    turn_after text,
    started_at timestamptz[] NOT NULL DEFAULT '{}',
    started_n integer[] NOT NULL DEFAULT '{}'
);

-- The starts of one group's last rate period (rate_limit_per_group).
CREATE TABLE {schema}.group_rate (
    queue text NOT NULL,
    group_key text NOT NULL,
    started_at timestamptz[] NOT NULL DEFAULT '{}',
    started_n integer[] NOT NULL DEFAULT '{}',
    PRIMARY KEY (queue, group_key)
);


-- The helpers of claim_limited() are plpgsql, not SQL: each query of a plpgsql
-- function keeps its plan for the session, where a SQL function's body that
-- cannot be inlined is planned again by every query that calls it.

-- The length of a rate window. Starts are stamped with the claim's time and
-- handlers begin later, not always equally late: on a busy machine one
-- worker's whole batch may start tens of milliseconds after another's (a full
-- parallel test run saw over 50 ms). With a window 10% (at most 500 ms) longer
-- than the period, the handlers' own clocks too see at most the limit start
-- within a period unless they lag each other by more than that margin.
CREATE FUNCTION {schema}.rate_window(p_period double precision) RETURNS interval
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$ SELECT make_interval(secs => p_period + least(p_period * 0.1, 0.5)) $$;

-- How many more jobs may start now under p_limit per p_period, given the
-- starts of the window (p_n[i] at p_at[i]).
CREATE FUNCTION {schema}.rate_room(
    p_at timestamptz[], p_n integer[], p_limit integer, p_period double precision,
    p_now timestamptz) RETURNS integer
    LANGUAGE plpgsql STABLE
    AS $$
BEGIN
    RETURN greatest(p_limit - coalesce((
        SELECT sum(s.n) FROM unnest(p_at, p_n) AS s (at, n)
        WHERE s.at > p_now - {schema}.rate_window(p_period)), 0), 0);
END
$$;

-- Seconds from p_now until a job may start again: when the oldest start of
-- the window leaves it.
CREATE FUNCTION {schema}.rate_wait(
    p_at timestamptz[], p_n integer[], p_period double precision, p_now timestamptz)
    RETURNS double precision
    LANGUAGE plpgsql STABLE
    AS $$
BEGIN
    RETURN (SELECT greatest(extract(epoch FROM min(s.at) + {schema}.rate_window(p_period) - p_now), 0)
            FROM unnest(p_at, p_n) AS s (at, n)
            WHERE s.at > p_now - {schema}.rate_window(p_period));
END
$$;

-- The window after p_count more starts at p_now: what has left it dropped
-- (everything, without a limit: p_period NULL).
CREATE FUNCTION {schema}.rate_started(
    p_at timestamptz[], p_n integer[], p_period double precision, p_count integer,
    p_now timestamptz, OUT started_at timestamptz[], OUT started_n integer[])
    LANGUAGE plpgsql STABLE
    AS $$
BEGIN
    IF p_period IS NULL THEN
        started_at := '{}';
        started_n := '{}';
        RETURN;
    END IF;
    SELECT coalesce(array_agg(s.at ORDER BY s.at), '{}') || p_now,
           coalesce(array_agg(s.n ORDER BY s.at), '{}') || p_count
    INTO started_at, started_n
    FROM unnest(p_at, p_n) AS s (at, n)
    WHERE s.at > p_now - {schema}.rate_window(p_period);
END
$$;

-- A key's head is claimable while no job of its key runs, it is its key's
-- earliest unfinished job, and (under 'block') no earlier job of its key
-- failed: the three probes of claim.sql, for claim_limited(). (claim.sql keeps
-- them inline, where the planner folds them into its one statement.)
CREATE FUNCTION {schema}.key_head_ready(
    p_queue text, p_key text, p_seq bigint, p_job_id bigint, p_failed_blocks boolean)
    RETURNS boolean
    LANGUAGE plpgsql STABLE
    AS $$
BEGIN
    RETURN (SELECT r.job_id FROM {schema}.job AS r
            WHERE r.queue = p_queue AND r.ordering_key = p_key AND r.status = 'running'
            LIMIT 1) IS NULL
       AND (SELECT e.job_id FROM {schema}.job AS e
            WHERE e.queue = p_queue AND e.ordering_key = p_key
              AND e.status IN ('queued', 'running')
            ORDER BY e.ordering_seq, e.job_id
            LIMIT 1) = p_job_id
       AND NOT (p_failed_blocks AND (
            SELECT f.ordering_seq FROM {schema}.job AS f
            WHERE f.queue = p_queue AND f.ordering_key = p_key AND f.status = 'failed'
              AND (f.ordering_seq, f.job_id) < (p_seq, p_job_id)
            ORDER BY f.ordering_seq, f.job_id
            LIMIT 1) IS NOT NULL);
END
$$;

-- The first group after p_after (NULL: the first group) with a queued job
-- that waits for no key: one probe of job_group_ready_idx.
CREATE FUNCTION {schema}.next_group(p_queue text, p_after text) RETURNS text
    LANGUAGE plpgsql STABLE
    AS $$
BEGIN
    IF p_after IS NULL THEN
        RETURN (SELECT j.group_key FROM {schema}.job AS j
                WHERE j.queue = p_queue AND j.status = 'queued' AND NOT j.blocked
                  AND j.group_key IS NOT NULL
                ORDER BY j.group_key
                LIMIT 1);
    END IF;
    RETURN (SELECT j.group_key FROM {schema}.job AS j
            WHERE j.queue = p_queue AND j.status = 'queued' AND NOT j.blocked
              AND j.group_key > p_after
            ORDER BY j.group_key
            LIMIT 1);
END
$$;

-- How many more jobs of group p_group may start now: its max_running_per_group
-- minus its live leases (at p_now), and its rate window's room (at
-- p_rate_now), less p_taken (what this claim already took of it). 2^31-1 when
-- the queue limits no group.
CREATE FUNCTION {schema}.group_room(
    p_queue {schema}.queue, p_group text, p_taken integer, p_now timestamptz,
    p_rate_now timestamptz)
    RETURNS integer
    LANGUAGE plpgsql STABLE
    AS $$
DECLARE
    room integer := 2147483647;
    window_ {schema}.group_rate;
BEGIN
    IF p_queue.max_running_per_group IS NOT NULL THEN
        room := p_queue.max_running_per_group - (
            SELECT count(*) FROM {schema}.job AS j
            WHERE j.queue = p_queue.name AND j.group_key = p_group AND j.status = 'running'
              AND j.lease_until > p_now);
    END IF;
    IF p_queue.rate_limit_per_group IS NOT NULL THEN
        SELECT * INTO window_ FROM {schema}.group_rate AS r
        WHERE r.queue = p_queue.name AND r.group_key = p_group;
        IF FOUND THEN
            room := least(room, {schema}.rate_room(
                window_.started_at, window_.started_n,
                p_queue.rate_limit_per_group, p_queue.rate_period_per_group, p_rate_now));
        ELSE
            room := least(room, p_queue.rate_limit_per_group);
        END IF;
    END IF;
    RETURN room - p_taken;
END
$$;

-- Pick up to p_limit jobs of a queue with limits or grouped jobs; claim.sql
-- calls it and claims what it returns. Claims of such a queue take turns on
-- its claim_turn row, and every query after that lock runs on a fresh
-- snapshot: it sees each claim committed before it.
--
-- The budget: p_limit, cut to max_running minus the live leases, and to the
-- rate window's room. Expired leases are recovered first, each within its
-- group's room. Then the participants take turns from the one after the last
-- served: each group with ready jobs (in group order), then the ungrouped jobs
-- as one more participant. A group at its max_running_per_group or out of
-- rate room is skipped at the cost of one probe, so it never holds up the
-- others. The first round takes one job per participant; each later round
-- shares what is left among the participants that had work in the last.
--
-- Returns (job_id, branch: 0 recovered / 1 ready, ready_at, limited: claimed
-- under a concurrency limit) per job; and, when a limit held the claim back,
-- a last row with a NULL job_id whose `wait` says in how many seconds a rate
-- window has room again (NULL: when a running job ends, which job_slot_freed
-- announces).
CREATE FUNCTION {schema}.claim_limited(p_queue text, p_limit integer)
    RETURNS TABLE (job_id bigint, branch integer, ready_at timestamptz, limited boolean,
                   wait double precision)
    LANGUAGE plpgsql
    ROWS 10
    AS $$
DECLARE
    q {schema}.queue;
    turn {schema}.claim_turn;
    now_ timestamptz := {schema}.clock();
    -- The rate windows' time: the schema's clock once this claim holds the lock
    -- (a claim stamped with the time it began waiting would let the next one
    -- through early by that wait).
    rate_now timestamptz;
    failed_blocks boolean;
    budget integer := p_limit;
    held_back boolean := false;
    next_wait double precision;
    picked bigint[] := '{}';
    -- What this claim took per group (parallel arrays).
    taken_groups text[] := '{}';
    taken_counts integer[] := '{}';
    taken integer;
    i integer;
    -- The participant visited: a group, or the ungrouped jobs (pos NULL).
    pos text;
    pos_ungrouped boolean;
    first_pos text;
    first_ungrouped boolean;
    stall_pos text;
    stall_ungrouped boolean;
    stalled boolean := false;
    share integer := 1;
    productive integer := 0;
    room integer;
    visits integer := 0;
    ids bigint[];
    ats timestamptz[];
    cand record;
BEGIN
    INSERT INTO {schema}.claim_turn AS t (queue) VALUES (p_queue) ON CONFLICT (queue) DO NOTHING;
    SELECT * INTO turn FROM {schema}.claim_turn AS t WHERE t.queue = p_queue FOR UPDATE;
    -- From here on every query sees each claim of this queue committed before ours.
    rate_now := now_ + (clock_timestamp() - statement_timestamp());
    SELECT * INTO q FROM {schema}.queue AS x WHERE x.name = p_queue;
    IF NOT FOUND OR q.paused THEN
        RETURN;
    END IF;
    failed_blocks := q.ordering_policy = 'block';

    IF q.max_running IS NOT NULL THEN
        room := q.max_running - (
            SELECT count(*) FROM {schema}.job AS j
            WHERE j.queue = p_queue AND j.status = 'running' AND j.lease_until > now_);
        IF room < budget THEN
            budget := greatest(room, 0);
            held_back := true;
        END IF;
    END IF;
    IF q.rate_limit IS NOT NULL THEN
        room := {schema}.rate_room(
            turn.started_at, turn.started_n, q.rate_limit, q.rate_period, rate_now);
        IF room < budget THEN
            budget := room;
            held_back := true;
            -- Its window is full once this claim's starts are in it.
            next_wait := {schema}.rate_wait(
                turn.started_at || rate_now, turn.started_n || room, q.rate_period, rate_now);
        END IF;
    END IF;

    -- Expired leases first: their jobs run again, each within its group's room.
    IF budget > 0 THEN
        FOR cand IN
            SELECT j.job_id, j.group_key, j.lease_until
            FROM {schema}.job AS j
            WHERE j.queue = p_queue AND j.status = 'running' AND j.lease_until <= now_
              AND j.attempts < j.max_attempts
            ORDER BY j.lease_until, j.job_id
            LIMIT p_limit + 100
            FOR UPDATE OF j SKIP LOCKED
        LOOP
            EXIT WHEN budget <= 0;
            IF cand.group_key IS NOT NULL THEN
                i := array_position(taken_groups, cand.group_key);
                taken := CASE WHEN i IS NULL THEN 0 ELSE taken_counts[i] END;
                IF {schema}.group_room(q, cand.group_key, taken, now_, rate_now) <= 0 THEN
                    held_back := true;
                    CONTINUE;
                END IF;
                IF i IS NULL THEN
                    taken_groups := taken_groups || cand.group_key;
                    taken_counts := taken_counts || 1;
                ELSE
                    taken_counts[i] := taken_counts[i] + 1;
                END IF;
            END IF;
            job_id := cand.job_id; branch := 0; ready_at := cand.lease_until; wait := NULL;
            limited := q.max_running IS NOT NULL
                OR (cand.group_key IS NOT NULL AND q.max_running_per_group IS NOT NULL);
            RETURN NEXT;
            picked := picked || cand.job_id;
            budget := budget - 1;
        END LOOP;
    END IF;

    -- Then the participants in turn, from the one after the last served.
    pos := turn.turn_after;
    pos_ungrouped := turn.turn_after IS NULL;
    WHILE budget > 0 AND visits < 100000 LOOP
        visits := visits + 1;
        -- The next participant: the group after pos, else the ungrouped jobs;
        -- after those, the first group.
        pos := {schema}.next_group(p_queue, CASE WHEN pos_ungrouped THEN NULL ELSE pos END);
        pos_ungrouped := pos IS NULL;
        IF visits = 1 THEN
            first_pos := pos;
            first_ungrouped := pos_ungrouped;
        ELSIF first_pos IS NOT DISTINCT FROM pos AND first_ungrouped = pos_ungrouped THEN
            -- A round is over: share what is left among those that had work.
            share := greatest(ceil(budget::numeric / greatest(productive, 1))::integer, 1);
            productive := 0;
        END IF;
        IF stalled AND stall_pos IS NOT DISTINCT FROM pos AND stall_ungrouped = pos_ungrouped THEN
            EXIT;  -- a whole round without a job: nothing more to take now
        END IF;

        room := least(share, budget);
        taken := 0;
        IF NOT pos_ungrouped THEN
            i := array_position(taken_groups, pos);
            taken := CASE WHEN i IS NULL THEN 0 ELSE taken_counts[i] END;
            room := least(room, {schema}.group_room(q, pos, taken, now_, rate_now));
            IF room <= 0 THEN
                held_back := true;
                IF q.rate_limit_per_group IS NOT NULL THEN
                    -- When its window (with what this claim took) has room again.
                    next_wait := least(next_wait, (
                        SELECT {schema}.rate_wait(
                            r.started_at || rate_now, r.started_n || taken,
                            q.rate_period_per_group, rate_now)
                        FROM (SELECT coalesce(g.started_at, '{}') AS started_at,
                                     coalesce(g.started_n, '{}') AS started_n
                              FROM (SELECT 1) AS one
                              LEFT JOIN {schema}.group_rate AS g
                                  ON g.queue = p_queue AND g.group_key = pos) AS r));
                END IF;
            END IF;
        END IF;
        ids := '{}';
        -- One query per ready index (job_ready_idx, job_group_ready_idx): a
        -- single one with `group_key IS NOT DISTINCT FROM pos` could use neither.
        IF room > 0 AND pos_ungrouped THEN
            SELECT coalesce(array_agg(c.job_id), '{}'), coalesce(array_agg(c.available_at), '{}')
            INTO ids, ats
            FROM (SELECT j.job_id, j.available_at
                  FROM {schema}.job AS j
                  WHERE j.queue = p_queue AND j.status = 'queued' AND NOT j.blocked
                    AND j.group_key IS NULL
                    AND j.available_at <= now_ AND j.attempts < j.max_attempts
                    AND j.job_id <> ALL (picked)
                    AND (j.ordering_key IS NULL OR {schema}.key_head_ready(
                        p_queue, j.ordering_key, j.ordering_seq, j.job_id, failed_blocks))
                  ORDER BY j.priority DESC, j.available_at, j.job_id
                  LIMIT room
                  FOR UPDATE OF j SKIP LOCKED) AS c;
        ELSIF room > 0 THEN
            SELECT coalesce(array_agg(c.job_id), '{}'), coalesce(array_agg(c.available_at), '{}')
            INTO ids, ats
            FROM (SELECT j.job_id, j.available_at
                  FROM {schema}.job AS j
                  WHERE j.queue = p_queue AND j.group_key = pos
                    AND j.status = 'queued' AND NOT j.blocked
                    AND j.available_at <= now_ AND j.attempts < j.max_attempts
                    AND j.job_id <> ALL (picked)
                    AND (j.ordering_key IS NULL OR {schema}.key_head_ready(
                        p_queue, j.ordering_key, j.ordering_seq, j.job_id, failed_blocks))
                  ORDER BY j.priority DESC, j.available_at, j.job_id
                  LIMIT room
                  FOR UPDATE OF j SKIP LOCKED) AS c;
        END IF;
        IF cardinality(ids) = 0 THEN
            IF NOT stalled THEN
                stalled := true;
                stall_pos := pos;
                stall_ungrouped := pos_ungrouped;
            END IF;
            CONTINUE;
        END IF;
        FOR i IN 1 .. cardinality(ids) LOOP
            job_id := ids[i]; branch := 1; ready_at := ats[i]; wait := NULL;
            limited := q.max_running IS NOT NULL
                OR (NOT pos_ungrouped AND q.max_running_per_group IS NOT NULL);
            RETURN NEXT;
        END LOOP;
        picked := picked || ids;
        budget := budget - cardinality(ids);
        productive := productive + 1;
        stalled := false;
        turn.turn_after := pos;
        IF NOT pos_ungrouped THEN
            i := array_position(taken_groups, pos);
            IF i IS NULL THEN
                taken_groups := taken_groups || pos;
                taken_counts := taken_counts || cardinality(ids);
            ELSE
                taken_counts[i] := taken_counts[i] + cardinality(ids);
            END IF;
        END IF;
    END LOOP;

    -- What was taken: the starts in the rate windows, and whose turn is next.
    IF cardinality(picked) > 0 THEN
        UPDATE {schema}.claim_turn AS t
        SET turn_after = turn.turn_after, started_at = s.started_at, started_n = s.started_n
        FROM {schema}.rate_started(turn.started_at, turn.started_n, q.rate_period,
                                   cardinality(picked), rate_now) AS s
        WHERE t.queue = p_queue;
    END IF;
    IF q.rate_limit_per_group IS NOT NULL THEN
        FOR i IN 1 .. cardinality(taken_groups) LOOP
            INSERT INTO {schema}.group_rate AS r (queue, group_key, started_at, started_n)
            VALUES (p_queue, taken_groups[i], ARRAY[rate_now], ARRAY[taken_counts[i]])
            ON CONFLICT (queue, group_key) DO UPDATE
            SET (started_at, started_n) = (
                SELECT s.started_at, s.started_n
                FROM {schema}.rate_started(r.started_at, r.started_n, q.rate_period_per_group,
                                           taken_counts[i], rate_now) AS s);
        END LOOP;
    END IF;
    IF held_back AND cardinality(picked) < p_limit THEN
        job_id := NULL; branch := 3; ready_at := NULL; limited := true; wait := next_wait;
        RETURN NEXT;
    END IF;
END
$$;

-- A job claimed under a concurrency limit has stopped running: its slot is
-- free, so say so on the schema's channel (the queue's name, as an enqueue
-- does) and a worker whose claim found the limit reached asks again at once.
-- The WHEN clause runs in C: other jobs never call this.
CREATE FUNCTION {schema}.slot_freed() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    PERFORM pg_notify({schema}.work_channel(TG_TABLE_SCHEMA), NEW.queue);
    RETURN NULL;
END
$$;

CREATE TRIGGER job_slot_freed
    AFTER UPDATE OF status ON {schema}.job
    FOR EACH ROW
    WHEN (OLD.limited AND OLD.status = 'running' AND NEW.status <> 'running')
    EXECUTE FUNCTION {schema}.slot_freed();

-- The schema's work channel, named as leaseq._statement.notify_channel names
-- it (a test holds the two together): leaseq_<schema>, or, past PostgreSQL's
-- 63-byte limit, the schema's first 38 characters and a digest.
CREATE FUNCTION {schema}.work_channel(p_schema text) RETURNS text
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$
    SELECT CASE WHEN length('leaseq_' || p_schema) <= 63 THEN 'leaseq_' || p_schema
                ELSE 'leaseq_' || left(p_schema, 38) || '_'
                     || left(encode(sha256(convert_to(p_schema, 'UTF8')), 'hex'), 16)
           END
$$;

-- enqueue_unique() of migration 0007 with the job's group as its last argument.
DROP FUNCTION {schema}.enqueue_unique(
    text, text, jsonb, integer, smallint, timestamptz, integer, text, bigint, text, jsonb,
    double precision, text, double precision);

CREATE FUNCTION {schema}.enqueue_unique(
    p_queue text, p_channel text, p_payload jsonb, p_payload_bytes integer,
    p_priority smallint, p_available_at timestamptz, p_max_attempts integer,
    p_ordering_key text, p_ordering_seq bigint, p_idempotency_key text,
    p_trace_context jsonb, p_timeout double precision,
    p_unique_key text, p_unique_for double precision, p_group_key text)
    RETURNS TABLE (job_id bigint, existing boolean)
    LANGUAGE plpgsql
    ROWS 1
    AS $$
DECLARE
    holder bigint;
    admitted record;
    inserted bigint;
BEGIN
    PERFORM pg_advisory_xact_lock({schema}.unique_lock_class(),
                                  hashtext(p_queue || E'\x1f' || p_unique_key));
    holder := {schema}.unique_holder(p_queue, p_unique_key);
    IF holder IS NOT NULL THEN
        RETURN QUERY SELECT holder, true;
        RETURN;
    END IF;
    SELECT * INTO admitted FROM {schema}.admit(p_queue, 1, p_payload_bytes, p_payload_bytes);
    INSERT INTO {schema}.job AS j (
        queue, payload, payload_bytes, priority, available_at, max_attempts,
        ordering_key, ordering_seq, idempotency_key, counted, trace_context,
        timeout_seconds, unique_key, unique_for, unique_held, group_key)
    VALUES (
        p_queue, p_payload, p_payload_bytes, p_priority, p_available_at,
        coalesce(p_max_attempts, admitted.max_attempts),
        p_ordering_key, p_ordering_seq, p_idempotency_key, admitted.counted, p_trace_context,
        p_timeout, p_unique_key, p_unique_for, true, p_group_key)
    ON CONFLICT (queue, unique_key) WHERE unique_held DO NOTHING
    RETURNING j.job_id INTO inserted;
    IF inserted IS NULL THEN
        IF admitted.counted THEN
            UPDATE {schema}.backlog AS b
                SET jobs = b.jobs - 1, bytes = b.bytes - p_payload_bytes
                WHERE b.queue = p_queue AND b.shard = pg_backend_pid() % 16;
        END IF;
        RETURN QUERY SELECT j.job_id, true FROM {schema}.job AS j
            WHERE j.queue = p_queue AND j.unique_key = p_unique_key AND j.unique_held;
        RETURN;
    END IF;
    IF p_channel IS NOT NULL THEN
        PERFORM pg_notify(p_channel, p_queue);
    END IF;
    RETURN QUERY SELECT inserted, false;
END
$$;
