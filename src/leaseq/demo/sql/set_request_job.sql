UPDATE {schema}.report_request SET job_id = %(job_id)s WHERE id = %(id)s
