-- leaseq migration 0004: the producer's trace context on each job.
--
-- With the `otel` extra and a configured tracer, an enqueue stores the context
-- of its `send` span here (the propagator's fields, e.g. {"traceparent": ...}),
-- and the worker's `process` span continues that trace. NULL when there is no
-- trace to continue. Adding a nullable column without a default rewrites
-- nothing: it is instant on a table of any size.
ALTER TABLE {schema}.job ADD COLUMN trace_context jsonb;
-- Archived jobs keep it too (job_archive has every column of job).
ALTER TABLE {schema}.job_archive ADD COLUMN trace_context jsonb;
