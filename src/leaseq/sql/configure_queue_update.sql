-- Change only the settings the caller named (the set_* flags); NULL clears a limit
-- (and, for a retention, keeps that state's finished jobs forever).
-- Setting any admission limit starts backlog counting for the queue, for good.
UPDATE {schema}.queue AS q
SET lease_seconds = CASE WHEN %(set_lease)s THEN %(lease)s ELSE q.lease_seconds END,
    max_attempts = CASE WHEN %(set_max_attempts)s THEN %(max_attempts)s ELSE q.max_attempts END,
    backoff_base_seconds = CASE WHEN %(set_backoff_base)s THEN %(backoff_base)s
                                ELSE q.backoff_base_seconds END,
    backoff_cap_seconds = CASE WHEN %(set_backoff_cap)s THEN %(backoff_cap)s
                               ELSE q.backoff_cap_seconds END,
    ordering_policy = CASE WHEN %(set_ordering_policy)s THEN %(ordering_policy)s
                           ELSE q.ordering_policy END,
    max_queued_jobs = CASE WHEN %(set_max_queued_jobs)s THEN %(max_queued_jobs)s::bigint
                           ELSE q.max_queued_jobs END,
    max_queued_bytes = CASE WHEN %(set_max_queued_bytes)s THEN %(max_queued_bytes)s::bigint
                            ELSE q.max_queued_bytes END,
    max_payload_bytes = CASE WHEN %(set_max_payload_bytes)s THEN %(max_payload_bytes)s::integer
                             ELSE q.max_payload_bytes END,
    paused = CASE WHEN %(set_paused)s THEN %(paused)s ELSE q.paused END,
    retain_done_seconds = CASE WHEN %(set_retain_done)s THEN %(retain_done)s::double precision
                               ELSE q.retain_done_seconds END,
    retain_cancelled_seconds = CASE WHEN %(set_retain_cancelled)s
                                    THEN %(retain_cancelled)s::double precision
                                    ELSE q.retain_cancelled_seconds END,
    retain_failed_seconds = CASE WHEN %(set_retain_failed)s
                                 THEN %(retain_failed)s::double precision
                                 ELSE q.retain_failed_seconds END,
    retention_mode = CASE WHEN %(set_retention_mode)s THEN %(retention_mode)s
                          ELSE q.retention_mode END,
    retain_archived_seconds = CASE WHEN %(set_retain_archived)s
                                   THEN %(retain_archived)s::double precision
                                   ELSE q.retain_archived_seconds END,
    max_running = CASE WHEN %(set_max_running)s THEN %(max_running)s::integer
                       ELSE q.max_running END,
    max_running_per_group = CASE WHEN %(set_max_running_per_group)s
                                 THEN %(max_running_per_group)s::integer
                                 ELSE q.max_running_per_group END,
    -- A rate limit comes as [starts, seconds] (NULL lifts it).
    rate_limit = CASE WHEN %(set_rate_limit)s THEN (%(rate_limit)s::double precision[])[1]::integer
                      ELSE q.rate_limit END,
    rate_period = CASE WHEN %(set_rate_limit)s THEN (%(rate_limit)s::double precision[])[2]
                       ELSE q.rate_period END,
    rate_limit_per_group = CASE WHEN %(set_rate_limit_per_group)s
                                THEN (%(rate_limit_per_group)s::double precision[])[1]::integer
                                ELSE q.rate_limit_per_group END,
    rate_period_per_group = CASE WHEN %(set_rate_limit_per_group)s
                                 THEN (%(rate_limit_per_group)s::double precision[])[2]
                                 ELSE q.rate_period_per_group END,
    counts_backlog = q.counts_backlog
        OR (%(set_max_queued_jobs)s AND %(max_queued_jobs)s::bigint IS NOT NULL)
        OR (%(set_max_queued_bytes)s AND %(max_queued_bytes)s::bigint IS NOT NULL),
    updated_at = statement_timestamp()
WHERE q.name = %(name)s
