-- leaseq migration 0001: the fenced-lease job table, per-queue settings,
-- backlog counters for admission limits, and the database clock.
--
-- "{schema}" is replaced by the quoted schema name before this file runs.
-- Append-only: never edit a migration that has shipped; add a new file.

-- Every time in leaseq comes from this function, never from a worker's clock.
-- Tests (and only tests) replace its body to move time forward without sleeping;
-- a plain SQL body keeps it inlinable into the claim's index condition.
CREATE FUNCTION {schema}.clock() RETURNS timestamptz
    LANGUAGE sql STABLE PARALLEL SAFE
    AS $$ SELECT statement_timestamp() $$;

-- Bounded exponential backoff with full jitter: uniform in [0, min(cap, base * 2^(attempt-1))].
-- The exponent is clamped so that huge attempt counts cannot overflow.
CREATE FUNCTION {schema}.backoff_seconds(attempt integer, base double precision, cap double precision)
    RETURNS double precision
    LANGUAGE sql VOLATILE PARALLEL SAFE
    AS $$ SELECT random() * least(cap, base * power(2::double precision, least(greatest(attempt - 1, 0), 62))) $$;

-- Appends one entry to a job's history, keeping the newest 50.
CREATE FUNCTION {schema}.history_append(history jsonb, entry jsonb) RETURNS jsonb
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$ SELECT CASE WHEN jsonb_array_length(history) >= 50 THEN history - 0 ELSE history END || jsonb_build_array(entry) $$;

CREATE TABLE {schema}.queue (
    name text PRIMARY KEY
        CHECK (name ~ '^[A-Za-z0-9_.:-]{1,128}$'),
    lease_seconds double precision NOT NULL DEFAULT 60
        CHECK (lease_seconds > 0 AND lease_seconds <= 86400),
    max_attempts integer NOT NULL DEFAULT 20
        CHECK (max_attempts BETWEEN 1 AND 1000),
    backoff_base_seconds double precision NOT NULL DEFAULT 1
        CHECK (backoff_base_seconds >= 0),
    backoff_cap_seconds double precision NOT NULL DEFAULT 3600
        CHECK (backoff_cap_seconds >= backoff_base_seconds),
    ordering_policy text NOT NULL DEFAULT 'block'
        CHECK (ordering_policy IN ('block', 'continue')),
    max_queued_jobs bigint CHECK (max_queued_jobs > 0),
    max_queued_bytes bigint CHECK (max_queued_bytes > 0),
    max_payload_bytes integer CHECK (max_payload_bytes > 0),
    paused boolean NOT NULL DEFAULT false,
    -- True once the queue has (or had) an admission limit: from then on its
    -- unfinished jobs are counted in {schema}.backlog (see admit()).
    counts_backlog boolean NOT NULL DEFAULT false,
    created_at timestamptz NOT NULL DEFAULT statement_timestamp(),
    updated_at timestamptz NOT NULL DEFAULT statement_timestamp()
);

CREATE TABLE {schema}.job (
    job_id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    -- No foreign key to queue: its KEY SHARE lock on one hot parent row would
    -- turn concurrent enqueues into multixact churn. admit() creates the row.
    queue text NOT NULL,
    payload jsonb NOT NULL,
    payload_bytes integer NOT NULL CHECK (payload_bytes >= 0),
    status text NOT NULL DEFAULT 'queued'
        CHECK (status IN ('queued', 'running', 'done', 'failed', 'cancelled')),
    -- Higher runs first.
    priority smallint NOT NULL DEFAULT 0,
    available_at timestamptz NOT NULL,
    lease_until timestamptz,
    lease_seconds double precision,
    -- The fencing token: incremented by every claim, never reset.
    lease_version bigint NOT NULL DEFAULT 0,
    attempts integer NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    max_attempts integer NOT NULL CHECK (max_attempts BETWEEN 1 AND 1000),
    ordering_key text CHECK (octet_length(ordering_key) <= 255),
    ordering_seq bigint,
    -- A producer-given business key; NULL means the job's identity is the key.
    idempotency_key text CHECK (octet_length(idempotency_key) <= 255),
    last_error text,
    -- The history of attempts that went wrong and of replays, newest last.
    history jsonb NOT NULL DEFAULT '[]',
    -- Whether this job is counted in {schema}.backlog (its queue has limits).
    counted boolean NOT NULL DEFAULT false,
    created_at timestamptz NOT NULL DEFAULT statement_timestamp(),
    claimed_at timestamptz,
    finished_at timestamptz,
    CHECK ((ordering_key IS NULL) = (ordering_seq IS NULL)),
    CHECK ((status = 'running') = (lease_until IS NOT NULL))
);

-- Ready jobs in exactly the claim's order, so the claim reads the head of this
-- index and stops; finished rows never enter it.
CREATE INDEX job_ready_idx ON {schema}.job (queue, priority DESC, available_at, job_id)
    WHERE status = 'queued';

-- Running leases by expiry: lease recovery and the reaper read its head.
CREATE INDEX job_lease_idx ON {schema}.job (queue, lease_until, job_id)
    WHERE status = 'running';

-- The earliest unfinished job of an ordering key. Failed jobs stay in the index
-- because a failed head blocks its key under the 'block' policy.
CREATE INDEX job_ordering_idx ON {schema}.job (queue, ordering_key, ordering_seq, job_id)
    WHERE ordering_key IS NOT NULL AND status IN ('queued', 'running', 'failed');

-- Queued jobs whose attempts are used up (after a released last attempt):
-- almost always empty, so the reaper finds them without scanning the backlog.
CREATE INDEX job_exhausted_idx ON {schema}.job (job_id)
    WHERE status = 'queued' AND attempts >= max_attempts;

-- Operators list failed jobs by queue; replay looks them up.
CREATE INDEX job_failed_idx ON {schema}.job (queue, finished_at, job_id)
    WHERE status = 'failed';

-- Every claim leaves a dead tuple at the head of the ready index: vacuum this
-- table far more eagerly than the global defaults.
ALTER TABLE {schema}.job SET (
    autovacuum_vacuum_scale_factor = 0.01,
    autovacuum_vacuum_threshold = 1000,
    autovacuum_vacuum_insert_scale_factor = 0.05,
    autovacuum_analyze_scale_factor = 0.02,
    autovacuum_vacuum_cost_delay = 0,
    fillfactor = 85
);

-- Unfinished (queued + running) jobs and their payload bytes per queue, kept
-- only for queues with admission limits. Rows are sharded by backend so that
-- producers holding long transactions do not queue behind each other;
-- shards >= 16 take the decrements of finishing jobs, so a worker never waits
-- for a producer's transaction.
CREATE TABLE {schema}.backlog (
    queue text NOT NULL,
    shard smallint NOT NULL CHECK (shard BETWEEN 0 AND 31),
    jobs bigint NOT NULL DEFAULT 0,
    bytes bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (queue, shard)
);

-- Admission for an enqueue of p_jobs jobs of p_bytes bytes in all (the
-- largest p_largest bytes): makes sure the queue exists, enforces the payload
-- cap and the backlog limits, counts the new jobs, and returns what the
-- insert needs. Concurrent enqueues may overshoot a limit by what is in flight.
CREATE FUNCTION {schema}.admit(p_queue text, p_jobs bigint, p_bytes bigint, p_largest bigint)
    RETURNS TABLE (max_attempts integer, counted boolean)
    LANGUAGE plpgsql
    AS $$
DECLARE
    settings {schema}.queue;
    backlog_jobs bigint;
    backlog_bytes bigint;
BEGIN
    SELECT * INTO settings FROM {schema}.queue AS q WHERE q.name = p_queue;
    IF NOT FOUND THEN
        INSERT INTO {schema}.queue AS q (name) VALUES (p_queue)
            ON CONFLICT (name) DO NOTHING;
        SELECT * INTO settings FROM {schema}.queue AS q WHERE q.name = p_queue;
    END IF;
    IF settings.max_payload_bytes IS NOT NULL AND p_largest > settings.max_payload_bytes THEN
        RAISE EXCEPTION 'payload of % bytes exceeds the limit of % bytes for queue %',
            p_largest, settings.max_payload_bytes, p_queue
            USING ERRCODE = 'LQ002';
    END IF;
    IF settings.counts_backlog THEN
        SELECT coalesce(sum(b.jobs), 0), coalesce(sum(b.bytes), 0)
            INTO backlog_jobs, backlog_bytes
            FROM {schema}.backlog AS b WHERE b.queue = p_queue;
        IF backlog_jobs + p_jobs > settings.max_queued_jobs THEN
            RAISE EXCEPTION 'queue % is full: % unfinished jobs, limit %',
                p_queue, backlog_jobs, settings.max_queued_jobs
                USING ERRCODE = 'LQ001';
        END IF;
        IF backlog_bytes + p_bytes > settings.max_queued_bytes THEN
            RAISE EXCEPTION 'queue % is full: % unfinished bytes, limit %',
                p_queue, backlog_bytes, settings.max_queued_bytes
                USING ERRCODE = 'LQ001';
        END IF;
        INSERT INTO {schema}.backlog AS b (queue, shard, jobs, bytes)
            VALUES (p_queue, pg_backend_pid() % 16, p_jobs, p_bytes)
            ON CONFLICT (queue, shard)
            DO UPDATE SET jobs = b.jobs + excluded.jobs, bytes = b.bytes + excluded.bytes;
    END IF;
    RETURN QUERY SELECT settings.max_attempts, settings.counts_backlog;
END
$$;

-- Keeps {schema}.backlog right when counted jobs finish or are replayed. The
-- trigger's WHEN clause runs in C, so claims, renewals and uncounted queues
-- never call this function.
CREATE FUNCTION {schema}.count_backlog() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
DECLARE
    sign integer := CASE WHEN NEW.status IN ('queued', 'running') THEN 1 ELSE -1 END;
BEGIN
    INSERT INTO {schema}.backlog AS b (queue, shard, jobs, bytes)
        VALUES (NEW.queue, 16 + pg_backend_pid() % 16, sign, sign * NEW.payload_bytes)
        ON CONFLICT (queue, shard)
        DO UPDATE SET jobs = b.jobs + excluded.jobs, bytes = b.bytes + excluded.bytes;
    RETURN NULL;
END
$$;

CREATE TRIGGER job_backlog_count
    AFTER UPDATE OF status ON {schema}.job
    FOR EACH ROW
    WHEN (NEW.counted AND (OLD.status IN ('queued', 'running')) <> (NEW.status IN ('queued', 'running')))
    EXECUTE FUNCTION {schema}.count_backlog();
