-- The queue's jobs running when a concurrency limit is set: they count against
-- it while they run (the claims count live leases), and, cut short (a cancel
-- while running, a release while the handler runs on), they must hold their
-- slot until their lease would have ended, as the jobs claimed under the limit
-- do. The trigger that writes that hold (job_slot_freed) fires for the jobs
-- marked `limited`, which a claim marks only under a limit set before it.
-- (A claim that read the settings before this change and commits after it
-- may still start one job unmarked.)
UPDATE {schema}.job AS j
SET limited = true
FROM {schema}.queue AS q
WHERE q.name = %(name)s
  AND j.queue = q.name
  AND j.status = 'running'
  AND NOT j.limited
  AND (q.max_running IS NOT NULL
       OR (j.group_key IS NOT NULL AND q.max_running_per_group IS NOT NULL))
