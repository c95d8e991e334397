-- (A fragment of the fenced batch writes: complete, fail, release, retry.)
-- Each claim's job as the statement's snapshot saw it, for the rows that say
-- whether a claim that wrote nothing had already written this very outcome (a
-- resend after an ambiguous commit). The job's row, or, once retention moved
-- the job to the archive, its archived row: a resend may come after a prune,
-- and the archive still says what the claim did. A snapshot sees a job in one
-- of the two (the move is one statement); the archive is read only for a job
-- that has no row in job.
LEFT JOIN LATERAL (
    SELECT j.status, j.lease_version, j.history
    FROM {schema}.job AS j WHERE j.job_id = c.job_id
    UNION ALL
    SELECT a.status, a.lease_version, a.history
    FROM {schema}.job_archive AS a WHERE a.job_id = c.job_id
    LIMIT 1
) AS before ON true
