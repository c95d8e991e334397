-- Before find_failed_jobs.sql, in its transaction. Its candidates must be read
-- in job_failed_idx's order, each queue's newest first, stopping at the window:
-- on some statistics the planner took a bitmap scan of every failed row and a
-- sort instead. And its estimated cost (the window per queue) passes
-- jit_above_cost: JIT compiled it for a quarter of a second, every page.
SET LOCAL enable_bitmapscan = off;
SET LOCAL jit = off
