-- Drop the rate windows of groups with no start left in them (group_rate,
-- migration 0009): one row per group that ever started a job under
-- rate_limit_per_group, which nothing else removes, so a group per tenant or
-- per user grew the table by a row per group ever seen. A window with no start
-- newer than its queue's period (plus its margin) counts nothing: a claim
-- writes a fresh one. Without a per-group rate the windows count nothing
-- either (rate_started drops them). Run with the reaper, each maintenance
-- round; a claim racing it upserts its row again.
DELETE FROM {schema}.group_rate AS r
WHERE NOT EXISTS (
    SELECT 1
    FROM {schema}.queue AS q, unnest(r.started_at) AS s (at)
    WHERE q.name = r.queue AND q.rate_period_per_group IS NOT NULL
      AND s.at > {schema}.clock() - {schema}.rate_window(q.rate_period_per_group))
