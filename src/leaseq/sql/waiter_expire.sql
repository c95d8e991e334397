-- Remove the wake-up entries of workers that ended without leaving them (killed,
-- or cut off from the database past their entries' expiry; migration 0020).
-- Run with the reaper, each maintenance round. Until then a stale entry costs
-- only a notification no one reads.
SELECT {schema}.waiter_expire()
