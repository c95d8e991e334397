-- The newest report requests, for the demo's home page.
SELECT r.id, r.customer, r.period, r.kind, r.job_id, rep.report_id IS NOT NULL AS has_report
FROM {schema}.report_request AS r
LEFT JOIN {schema}.report AS rep ON rep.report_id = r.id
ORDER BY r.id DESC
LIMIT %(limit)s
