SELECT html FROM {schema}.report WHERE report_id = %(id)s
