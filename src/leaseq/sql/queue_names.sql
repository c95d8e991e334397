-- The schema's queues by name (every queue enqueued into or configured): what a
-- dashboard's queue filter lists, without reading a job.
SELECT q.name FROM {schema}.queue AS q ORDER BY q.name
