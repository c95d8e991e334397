-- leaseq migration 0026: a tenant's burst holds up no other tenant's jobs.
--
-- 1. Expired leases of full groups. A claim reads the oldest expired leases
-- (its limit plus 100) and passes over those whose group has no room: a dead
-- worker's 150 jobs of one tenant, whose group is at its limit once one is
-- recovered, filled that read in every claim, and another tenant's expired
-- lease behind them was never recovered until the first tenant's had all run
-- again. Now the claim reads again, the groups found without room left out
-- (ten reads at most, each only after one that was full and found such
-- groups).
--
-- 2. A claim that made its most deferred jobs ready still starts the other
-- groups' ready jobs.
-- Each grouped claim makes the deferred jobs now due ready, 1,000 at most
-- (0017), and takes in their groups only the jobs before the first of them
-- (0022). A claim that made its most ready took no job at all: due jobs still
-- deferred might precede any. So one tenant's burst coming due at once (a
-- nightly batch of 100,000, retries after an outage) held up every tenant's
-- ready jobs until the claims had made the whole burst ready, 1,000 a claim:
-- claim() came back empty ten claims in a row, a worker's poll interval each,
-- a hundred claims for 100,000 jobs.
--
-- Now such a claim walks the groups all the same; in each group it visits it
-- also reads the first job due and still deferred in the group's order (one
-- probe of job_group_ready_idx per priority the group's deferred jobs hold,
-- each range bounded by time, stopping at the first priority with one due),
-- and takes only the jobs before the earlier of that one and the first it
-- made ready. A group without due jobs left deferred loses nothing. Only a
-- claim that made its most ready reads it: the others made every due job
-- ready (but those locked by another transaction, as before).
-- The rest is 0022's.
CREATE OR REPLACE FUNCTION {schema}.claim_limited(p_queue text, p_limit integer)
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
    -- Whether the walk passed over groups without room, and the seconds until
    -- the first of those full for their rate has room (NULL: none was).
    skipped boolean;
    skipped_wait double precision;
    -- The room of the group visited under its limits (next_open_group()).
    group_room_left integer;
    -- An expired lease put back behind an earlier job of its key (0012).
    requeued boolean := false;
    share integer := 1;
    productive integer := 0;
    room integer;
    visits integer := 0;
    ids bigint[];
    ats timestamptz[];
    -- How many deferred jobs this claim made ready (claimable from the next claim
    -- on), their ids, and per group the first of them in claim order (parallel
    -- arrays): this claim takes only the group's ready jobs before that one.
    staged integer := 0;
    staged_ids bigint[] := '{}';
    staged_groups text[] := '{}';
    staged_priorities integer[];
    staged_ats timestamptz[];
    staged_firsts bigint[];
    first_priority integer;
    first_at timestamptz;
    first_id bigint;
    -- The group's first job due and still deferred, when this claim made its
    -- most ready (0026).
    late_priority integer;
    late_at timestamptz;
    late_id bigint;
    k integer;
    cand record;
    -- The expired leases' passes (0026): the groups found without room, and
    -- what the last pass read.
    full_groups text[] := '{}';
    new_full boolean;
    passes integer := 0;
    read_n integer;
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

    -- The deferred jobs now due join their groups' turns. Whatever this claim
    -- may take: a held-back claim leaves them ready for the next one. (Probed
    -- first: most claims find none, and the probe costs less than the UPDATE.)
    IF EXISTS (SELECT 1 FROM {schema}.job AS j
               WHERE j.queue = p_queue AND j.deferred AND j.available_at <= now_) THEN
        WITH due AS (
            SELECT j.job_id FROM {schema}.job AS j
            WHERE j.queue = p_queue AND j.deferred AND j.available_at <= now_
            ORDER BY j.available_at, j.job_id
            LIMIT 1000
            FOR UPDATE OF j SKIP LOCKED),
        made AS (
            UPDATE {schema}.job AS j SET deferred = false
            FROM due WHERE j.job_id = due.job_id
            RETURNING j.job_id, j.group_key, j.priority, j.available_at)
        SELECT coalesce((SELECT array_agg(m.job_id) FROM made AS m), '{}'),
               coalesce(array_agg(f.group_key), '{}'), array_agg(f.priority),
               array_agg(f.available_at), array_agg(f.job_id)
        INTO staged_ids, staged_groups, staged_priorities, staged_ats, staged_firsts
        FROM (SELECT DISTINCT ON (m.group_key) m.group_key, m.priority, m.available_at, m.job_id
              FROM made AS m
              ORDER BY m.group_key, m.priority DESC, m.available_at, m.job_id) AS f;
        staged := cardinality(staged_ids);
    END IF;

    IF q.max_running IS NOT NULL THEN
        room := q.max_running - (
            SELECT count(*) FROM {schema}.job AS j
            WHERE j.queue = p_queue AND j.status = 'running' AND j.lease_until > now_)
            - {schema}.slots_held(p_queue, now_);
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
    -- In passes (0026): a group found without room is left out of the next
    -- pass, so that its expired leases (a dead worker's hundreds of one
    -- tenant's jobs) do not fill every read and hold up the other groups'.
    WHILE budget > 0 AND passes < 10 LOOP
        passes := passes + 1;
        read_n := 0;
        new_full := false;
        FOR cand IN
            SELECT j.job_id, j.group_key, j.lease_until, j.ordering_key
            FROM {schema}.job AS j
            WHERE j.queue = p_queue AND j.status = 'running' AND j.lease_until <= now_
              AND j.attempts < j.max_attempts
              AND j.job_id <> ALL (picked)
              AND (j.group_key IS NULL OR j.group_key <> ALL (full_groups))
            ORDER BY j.lease_until, j.job_id
            LIMIT p_limit + 100
            FOR UPDATE OF j SKIP LOCKED
        LOOP
            read_n := read_n + 1;
            EXIT WHEN budget <= 0;
            -- Put back before it counts against any room or rate window: it
            -- does not start.
            IF cand.ordering_key IS NOT NULL AND {schema}.lease_requeue(cand.job_id) THEN
                requeued := true;
                CONTINUE;
            END IF;
            IF cand.group_key IS NOT NULL THEN
                i := array_position(taken_groups, cand.group_key);
                taken := CASE WHEN i IS NULL THEN 0 ELSE taken_counts[i] END;
                IF {schema}.group_room(q, cand.group_key, taken, now_, rate_now) <= 0 THEN
                    held_back := true;
                    IF cand.group_key <> ALL (full_groups) THEN
                        full_groups := full_groups || cand.group_key;
                        new_full := true;
                    END IF;
                    IF q.rate_limit_per_group IS NOT NULL THEN
                        -- (Its group may have no queued job, which the walk
                        -- would see: without this, no wait was said at all.)
                        next_wait := least(next_wait, {schema}.group_rate_wait(
                            p_queue, cand.group_key, taken, q.rate_period_per_group, rate_now));
                    END IF;
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
        -- Again only if this read was full and found groups without room
        -- (a put-back ends the walk anyway).
        EXIT WHEN read_n < p_limit + 100 OR NOT new_full OR requeued;
    END LOOP;

    -- Then the participants in turn, from the one after the last served.
    pos := turn.turn_after;
    pos_ungrouped := turn.turn_after IS NULL;
    -- Not after a put-back: settling its key made an earlier job the head, a
    -- row this query changed, which the claim's own UPDATE must not touch. The
    -- marker (4) has the client claim again.
    -- After making deferred jobs ready the walk goes on (0022): this statement
    -- cannot take those (rows it changed), and in their groups it takes only
    -- the jobs they would not precede; the marker (5) has the client claim
    -- again for them. (Taking nothing then, as 0017 did, stalled the queue
    -- while jobs came due at every claim.) When it made its most ready, jobs
    -- due and still deferred may precede some: in each group only the jobs
    -- before the first of those start too (0026).
    WHILE budget > 0 AND visits < 100000 AND NOT requeued LOOP
        visits := visits + 1;
        -- The next participant: the group after pos, else the ungrouped jobs;
        -- after those, the first group.
        IF q.rate_limit_per_group IS NULL AND q.max_running_per_group IS NULL THEN
            pos := {schema}.next_group(p_queue, CASE WHEN pos_ungrouped THEN NULL ELSE pos END);
        ELSE
            -- Passing over the groups without room under their limits in one
            -- query (a visit each cost ~40 µs of plpgsql calls). Within a
            -- claim no group it passed over gains room but by a job ending
            -- (other claims of the queue wait for this one's lock, and the
            -- windows are written at its end): each round stops at the same
            -- participants, or more.
            SELECT o.group_key, o.room, o.skipped, o.skipped_wait
            INTO pos, group_room_left, skipped, skipped_wait
            FROM {schema}.next_open_group(
                p_queue, CASE WHEN pos_ungrouped THEN NULL ELSE pos END,
                q.max_running_per_group, q.rate_limit_per_group, q.rate_period_per_group,
                now_, rate_now) AS o;
            IF skipped THEN
                held_back := true;
                next_wait := least(next_wait, skipped_wait);
            END IF;
        END IF;
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
            IF q.rate_limit_per_group IS NULL AND q.max_running_per_group IS NULL THEN
                room := least(room, {schema}.group_room(q, pos, taken, now_, rate_now));
            ELSE
                -- Its room was read by next_open_group(): not again.
                room := least(room, group_room_left - taken);
            END IF;
            IF room <= 0 THEN
                held_back := true;
                IF q.rate_limit_per_group IS NOT NULL THEN
                    -- When its window (with what this claim took) has room again.
                    next_wait := least(next_wait, {schema}.group_rate_wait(
                        p_queue, pos, taken, q.rate_period_per_group, rate_now));
                END IF;
            END IF;
        END IF;
        ids := '{}';
        -- One query per ready index (job_ready_idx, job_group_ready_idx): a
        -- single one with `group_key IS NOT DISTINCT FROM pos` could use neither.
        IF room > 0 AND pos_ungrouped THEN
            SELECT coalesce(array_agg(c.job_id), '{}'), coalesce(array_agg(c.available_at), '{}')
            INTO ids, ats
            FROM (WITH RECURSIVE priorities AS (
                      (SELECT j.priority FROM {schema}.job AS j
                       WHERE j.queue = p_queue AND j.status = 'queued' AND NOT j.blocked
                         AND j.group_key IS NULL
                       ORDER BY j.priority DESC LIMIT 1)
                      UNION ALL
                      SELECT (SELECT j.priority FROM {schema}.job AS j
                              WHERE j.queue = p_queue AND j.status = 'queued' AND NOT j.blocked
                                AND j.group_key IS NULL AND j.priority < p.priority
                              ORDER BY j.priority DESC LIMIT 1)
                      FROM priorities AS p WHERE p.priority IS NOT NULL)
                  SELECT r.job_id, r.available_at
                  FROM priorities AS p
                  CROSS JOIN LATERAL (
                      SELECT j.job_id, j.available_at
                      FROM {schema}.job AS j
                      WHERE j.queue = p_queue AND j.status = 'queued' AND NOT j.blocked
                        AND j.group_key IS NULL AND j.priority = p.priority
                        AND j.available_at <= now_ AND j.attempts < j.max_attempts
                        AND j.job_id <> ALL (picked)
                        AND (j.ordering_key IS NULL OR {schema}.key_head_ready(
                            p_queue, j.ordering_key, j.ordering_seq, j.job_id, failed_blocks))
                      ORDER BY j.available_at, j.job_id
                      LIMIT room
                      FOR UPDATE OF j SKIP LOCKED) AS r
                  LIMIT room) AS c;
        ELSIF room > 0 THEN
            -- The first job of the group this claim made ready, if any: only
            -- the jobs before it in the group's order may start now.
            k := array_position(staged_groups, pos);
            first_priority := staged_priorities[k];
            first_at := staged_ats[k];
            first_id := staged_firsts[k];
            IF staged >= 1000 THEN
                -- It made its most ready: the group's first job due and still
                -- deferred (its priorities one at a time, each bounded by time,
                -- the highest with one due first) bounds the jobs too.
                late_id := NULL;
                SELECT r.priority, r.available_at, r.job_id INTO late_priority, late_at, late_id
                FROM (WITH RECURSIVE priorities AS (
                          (SELECT j.priority FROM {schema}.job AS j
                           WHERE j.queue = p_queue AND j.deferred AND j.group_key = pos
                             AND j.status = 'queued' AND NOT j.blocked
                           ORDER BY j.priority DESC LIMIT 1)
                          UNION ALL
                          SELECT (SELECT j.priority FROM {schema}.job AS j
                                  WHERE j.queue = p_queue AND j.deferred AND j.group_key = pos
                                    AND j.status = 'queued' AND NOT j.blocked
                                    AND j.priority < p.priority
                                  ORDER BY j.priority DESC LIMIT 1)
                          FROM priorities AS p WHERE p.priority IS NOT NULL)
                      SELECT d.priority, d.available_at, d.job_id
                      FROM priorities AS p
                      CROSS JOIN LATERAL (
                          SELECT j.priority, j.available_at, j.job_id
                          FROM {schema}.job AS j
                          WHERE j.queue = p_queue AND j.deferred AND j.group_key = pos
                            AND j.status = 'queued' AND NOT j.blocked
                            AND j.priority = p.priority AND j.available_at <= now_
                          ORDER BY j.available_at, j.job_id
                          LIMIT 1) AS d
                      LIMIT 1) AS r;
                IF late_id IS NOT NULL AND (
                    first_id IS NULL OR late_priority > first_priority
                    OR (late_priority = first_priority
                        AND (late_at, late_id) < (first_at, first_id))) THEN
                    first_priority := late_priority;
                    first_at := late_at;
                    first_id := late_id;
                END IF;
            END IF;
            SELECT coalesce(array_agg(c.job_id), '{}'), coalesce(array_agg(c.available_at), '{}')
            INTO ids, ats
            FROM (WITH RECURSIVE priorities AS (
                      (SELECT j.priority FROM {schema}.job AS j
                       WHERE j.queue = p_queue AND j.group_key = pos
                         AND j.status = 'queued' AND NOT j.blocked AND NOT j.deferred
                       ORDER BY j.priority DESC LIMIT 1)
                      UNION ALL
                      SELECT (SELECT j.priority FROM {schema}.job AS j
                              WHERE j.queue = p_queue AND j.group_key = pos
                                AND j.status = 'queued' AND NOT j.blocked AND NOT j.deferred
                                AND j.priority < p.priority
                              ORDER BY j.priority DESC LIMIT 1)
                      FROM priorities AS p WHERE p.priority IS NOT NULL)
                  SELECT r.job_id, r.available_at
                  FROM priorities AS p
                  CROSS JOIN LATERAL (
                      SELECT j.job_id, j.available_at
                      FROM {schema}.job AS j
                      WHERE j.queue = p_queue AND j.group_key = pos
                        AND j.status = 'queued' AND NOT j.blocked AND j.priority = p.priority
                        AND NOT j.deferred
                        AND j.available_at <= now_ AND j.attempts < j.max_attempts
                        AND j.job_id <> ALL (picked)
                        AND j.job_id <> ALL (staged_ids)
                        AND (first_id IS NULL OR j.priority > first_priority
                             OR (j.priority = first_priority
                                 AND (j.available_at, j.job_id) < (first_at, first_id)))
                        AND (j.ordering_key IS NULL OR {schema}.key_head_ready(
                            p_queue, j.ordering_key, j.ordering_seq, j.job_id, failed_blocks))
                      ORDER BY j.available_at, j.job_id
                      LIMIT room
                      FOR UPDATE OF j SKIP LOCKED) AS r
                  LIMIT room) AS c;
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
    IF requeued THEN
        job_id := NULL; branch := 4; ready_at := NULL; limited := false; wait := NULL;
        RETURN NEXT;
    ELSIF held_back AND cardinality(picked) < p_limit THEN
        job_id := NULL; branch := 3; ready_at := NULL; limited := true; wait := next_wait;
        RETURN NEXT;
    END IF;
    IF staged > 0 AND cardinality(picked) < p_limit THEN
        job_id := NULL; branch := 5; ready_at := NULL; limited := false; wait := NULL;
        RETURN NEXT;
    END IF;
END
$$;
