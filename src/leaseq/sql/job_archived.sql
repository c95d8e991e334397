-- Where a job the job table no longer holds went, if retention moved it to the
-- archive: its status and when (no row: never enqueued here, or deleted).
SELECT a.status, a.archived_at FROM {schema}.job_archive AS a WHERE a.job_id = %(job_id)s
