SELECT q.name, q.lease_seconds, q.max_attempts, q.backoff_base_seconds, q.backoff_cap_seconds,
       q.ordering_policy, q.max_queued_jobs, q.max_queued_bytes, q.max_payload_bytes, q.paused,
       (SELECT coalesce(sum(b.jobs), 0) FROM {schema}.backlog AS b WHERE b.queue = q.name),
       (SELECT coalesce(sum(b.bytes), 0) FROM {schema}.backlog AS b WHERE b.queue = q.name),
       q.retain_done_seconds, q.retain_cancelled_seconds, q.retain_failed_seconds,
       q.retention_mode, q.retain_archived_seconds,
       q.max_running, q.max_running_per_group, q.rate_limit, q.rate_period,
       q.rate_limit_per_group, q.rate_period_per_group
FROM {schema}.queue AS q
WHERE q.name = %(name)s
