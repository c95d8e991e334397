-- leaseq migration 0008: periodic jobs.
--
-- Schedules are declared in code (App.periodic); every worker of the app runs
-- them, none is a leader. A schedule's row is its bookkeeping: the latest tick
-- handled, the next one due, what was enqueued and skipped. A worker handles a
-- schedule's due ticks in one transaction that holds the row locked (FOR
-- UPDATE SKIP LOCKED: another worker skips it meanwhile), so its ticks are
-- handled once, in order, and a crash rolls back the tick and its job together.
CREATE TABLE {schema}.schedule (
    name text PRIMARY KEY CHECK (octet_length(name) BETWEEN 1 AND 128),
    queue text NOT NULL,
    -- What the declaration said: 'cron <expression>' or 'every <seconds>'.
    spec text NOT NULL,
    tz text NOT NULL DEFAULT 'UTC',
    -- The latest tick handled (enqueued, skipped, or passed while paused).
    last_tick timestamptz,
    next_tick timestamptz NOT NULL,
    enqueued bigint NOT NULL DEFAULT 0,
    -- Missed ticks older than the catch-up window (never enqueued).
    skipped bigint NOT NULL DEFAULT 0,
    -- Ticks that came while the queue was paused (bookkeeping only, no job).
    paused bigint NOT NULL DEFAULT 0,
    last_job_id bigint,
    created_at timestamptz NOT NULL DEFAULT statement_timestamp(),
    updated_at timestamptz NOT NULL DEFAULT statement_timestamp()
);

-- One row per tick that enqueued its job, inserted with the job in one
-- statement: the primary key is the last word on "once per tick". Rows older
-- than a day are removed by the schedule's own later ticks.
CREATE TABLE {schema}.schedule_tick (
    schedule text NOT NULL,
    tick_at timestamptz NOT NULL,
    job_id bigint NOT NULL,
    PRIMARY KEY (schedule, tick_at)
);
