-- leaseq migration 0011: a rate window keeps a bounded number of entries.
--
-- rate_started() appended one (time, count) pair per claim that started jobs,
-- and every claim of a rate-limited queue reads and rewrites the whole window
-- (claim_turn, group_rate). A window of a long period with many claims grew
-- without bound: a limit of 100,000 a day, claimed one job at a time, held
-- 25,000 entries after 25,000 claims and each claim took 55 ms instead of
-- 1 ms (claims of a limited queue take turns, so the whole queue slowed).
--
-- Now the starts are counted per slot of 1/128 of the period, each stamped
-- with its slot's end: a window holds at most about 140 entries whatever the
-- claims. A start stamped later than it happened stays in the window longer,
-- never shorter: no window of one period ever holds more than the limit, and a
-- start may wait up to one slot longer than it had to at the window's edge
-- (80 ms for a limit per 10 s, 11 minutes for a limit per day).

CREATE OR REPLACE FUNCTION {schema}.rate_started(
    p_at timestamptz[], p_n integer[], p_period double precision, p_count integer,
    p_now timestamptz, OUT started_at timestamptz[], OUT started_n integer[])
    LANGUAGE plpgsql STABLE
    AS $$
DECLARE
    slot double precision;
    stamp timestamptz;
    last integer;
BEGIN
    IF p_period IS NULL THEN
        started_at := '{}';
        started_n := '{}';
        RETURN;
    END IF;
    slot := p_period / 128;
    stamp := to_timestamp(ceil(extract(epoch FROM p_now)::double precision / slot) * slot);
    SELECT coalesce(array_agg(s.at ORDER BY s.at), '{}'),
           coalesce(array_agg(s.n ORDER BY s.at), '{}')
    INTO started_at, started_n
    FROM unnest(p_at, p_n) AS s (at, n)
    WHERE s.at > p_now - {schema}.rate_window(p_period);
    last := cardinality(started_at);
    IF last > 0 AND started_at[last] = stamp THEN
        started_n[last] := started_n[last] + p_count;
    ELSE
        started_at := started_at || stamp;
        started_n := started_n || p_count;
    END IF;
END
$$;
