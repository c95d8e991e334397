INSERT INTO {schema}.report (report_id, html, total, lease_version)
VALUES (%(report_id)s, %(html)s, %(total)s, %(lease_version)s)
