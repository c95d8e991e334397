-- Tests only: shift the queue's clock by {offset_seconds} seconds. A literal,
-- not a parameter, so the function stays a plain inlinable expression.
CREATE OR REPLACE FUNCTION {schema}.clock() RETURNS timestamptz
    LANGUAGE sql STABLE PARALLEL SAFE
    AS $$ SELECT statement_timestamp() + interval '{offset_seconds} seconds' $$
