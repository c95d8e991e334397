-- leaseq migration 0006: admit() is planned as the one row it returns.
--
-- A set-returning function is assumed to return 1,000 rows unless declared
-- otherwise. The enqueue statements join admit() with their input, so the
-- planner multiplied a batch of 1,000 jobs into an estimate of 1,000,000 rows;
-- that cost passed jit_above_cost, and every such enqueue_many spent ~10 ms of
-- its ~17 ms compiling expressions with JIT, on the producer's own connection.
ALTER FUNCTION {schema}.admit(text, bigint, bigint, bigint) ROWS 1;
