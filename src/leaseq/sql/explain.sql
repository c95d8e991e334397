-- Prefixed to a statement (the claim) to read its live plan: the plan the
-- server picks now, for these parameters, on today's statistics. Not ANALYZE:
-- the statement itself never runs.
EXPLAIN (COSTS true, FORMAT TEXT)
