-- leaseq migration 0017: a grouped claim visits only the groups with a job due.
--
-- A claim of a queue with grouped jobs took every group with a queued job in
-- turn (next_group(), one probe of job_group_ready_idx each), due or not: with
-- 10,000 groups whose jobs all waited (each tenant's report scheduled for
-- tomorrow, retries backing off through an outage) every claim, and every
-- idle worker's poll, read ~370,000 pages to start nothing.
--
-- Now a grouped job that is queued with a future available_at is `deferred`
-- (set by a row trigger on every write of its status or time, so no statement
-- has to know): the walk over the groups skips it (job_group_ready_idx now
-- leads with `deferred`), and job_deferred_idx holds it in time order. Each
-- grouped claim first makes the deferred jobs now due ready (`deferred =
-- false`, at most 1,000 a claim, SKIP LOCKED): what it reads is what came due
-- since the last claim. Those rows changed inside the claim's own statement,
-- whose UPDATE cannot take them: a claim that made any ready takes no ready
-- job (expired leases only), and a marker row (5) tells the client to claim
-- again at once, which sees every job due in its order.
-- Ungrouped jobs are never deferred: the plain claim bounds its index range by
-- time (claim.sql), which a walk over groups cannot.

ALTER TABLE {schema}.job ADD COLUMN deferred boolean NOT NULL DEFAULT false;
-- (every column of the job table is kept by the archive: sql/prune.sql)
ALTER TABLE {schema}.job_archive ADD COLUMN deferred boolean NOT NULL DEFAULT false;

-- A grouped job is deferred while it is queued for later; the BEFORE triggers
-- that set its time (job_key_enter_*) run first (triggers fire by name). Every
-- statement that queues a job again sets its available_at (retry, release,
-- replay, lease_requeue), so the update trigger watches that column (and
-- `deferred`), not the status: a claim or a completion neither calls it nor
-- reads its WHEN clause (tests/test_statement_cost.py), and an enqueue for now
-- calls nothing either. A job cancelled while deferred stays flagged until the
-- claim that would have made it ready clears it. Either value is safe for any
-- row: a job not deferred is found by the walk, one deferred is made ready once
-- due; `deferred` only spares the walk the groups with nothing due.
CREATE FUNCTION {schema}.job_defer() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    NEW.deferred := NEW.status = 'queued' AND NEW.available_at > {schema}.clock();
    RETURN NEW;
END
$$;
CREATE TRIGGER job_wait_insert BEFORE INSERT ON {schema}.job
    FOR EACH ROW WHEN (NEW.group_key IS NOT NULL AND NEW.available_at > NEW.created_at)
    EXECUTE FUNCTION {schema}.job_defer();
CREATE TRIGGER job_wait_update BEFORE UPDATE OF available_at, deferred ON {schema}.job
    FOR EACH ROW WHEN (NEW.group_key IS NOT NULL) EXECUTE FUNCTION {schema}.job_defer();

UPDATE {schema}.job SET deferred = true
WHERE group_key IS NOT NULL AND status = 'queued' AND available_at > {schema}.clock();

-- The grouped index leads with `deferred` after the queue: the walk over groups
-- reads the jobs not deferred alone; a reader of all grouped queued jobs (the
-- claim's test for groups, stats(), and those of older leaseq versions during
-- a rolling upgrade) still finds its predicate.
CREATE INDEX job_group_due_idx
    ON {schema}.job (queue, deferred, group_key, priority DESC, available_at, job_id)
    WHERE status = 'queued' AND NOT blocked AND group_key IS NOT NULL;
DROP INDEX {schema}.job_group_ready_idx;
ALTER INDEX {schema}.job_group_due_idx RENAME TO job_group_ready_idx;

-- The deferred jobs of a queue by the time they come due: a claim reads those due.
CREATE INDEX job_deferred_idx ON {schema}.job (queue, available_at, job_id) WHERE deferred;

-- As in 0009, over the groups with a job that is not deferred.
CREATE OR REPLACE FUNCTION {schema}.next_group(p_queue text, p_after text) RETURNS text
    LANGUAGE plpgsql STABLE
    AS $$
BEGIN
    IF p_after IS NULL THEN
        RETURN (SELECT j.group_key FROM {schema}.job AS j
                WHERE j.queue = p_queue AND j.status = 'queued' AND NOT j.blocked
                  AND j.group_key IS NOT NULL AND NOT j.deferred
                ORDER BY j.group_key
                LIMIT 1);
    END IF;
    RETURN (SELECT j.group_key FROM {schema}.job AS j
            WHERE j.queue = p_queue AND j.status = 'queued' AND NOT j.blocked
              AND j.group_key > p_after AND NOT j.deferred
            ORDER BY j.group_key
            LIMIT 1);
END
$$;

-- 0016's, with the deferred jobs now due moved back first (see above).
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
    -- An expired lease put back behind an earlier job of its key (0012).
    requeued boolean := false;
    share integer := 1;
    productive integer := 0;
    room integer;
    visits integer := 0;
    ids bigint[];
    ats timestamptz[];
    -- How many deferred jobs this claim made ready (claimable from the next claim
    -- on: this one then takes no ready job).
    staged integer := 0;
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
            FOR UPDATE OF j SKIP LOCKED)
        UPDATE {schema}.job AS j SET deferred = false
        FROM due WHERE j.job_id = due.job_id;
        GET DIAGNOSTICS staged = ROW_COUNT;
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
    IF budget > 0 THEN
        FOR cand IN
            SELECT j.job_id, j.group_key, j.lease_until, j.ordering_key
            FROM {schema}.job AS j
            WHERE j.queue = p_queue AND j.status = 'running' AND j.lease_until <= now_
              AND j.attempts < j.max_attempts
            ORDER BY j.lease_until, j.job_id
            LIMIT p_limit + 100
            FOR UPDATE OF j SKIP LOCKED
        LOOP
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
    -- Not after a put-back: settling its key made an earlier job the head, a
    -- row this query changed, which the claim's own UPDATE must not touch. The
    -- marker (4) has the client claim again.
    -- Nor after making deferred jobs ready: this statement cannot take them,
    -- and a walk without them could start a job of their group they should
    -- precede (a lower priority). The marker (5) has the client claim again.
    WHILE budget > 0 AND visits < 100000 AND NOT requeued AND staged = 0 LOOP
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
