-- Whether no transaction below the fence still runs: every producer that enqueued
-- without seeing the worker's entry has committed (or rolled back), so a claim
-- from now on sees its jobs (migration 0020).
SELECT pg_snapshot_xmin(pg_current_snapshot()) >= %(fence)s::text::xid8
