INSERT INTO {schema}.report_request (customer, period, kind)
VALUES (%(customer)s, %(period)s, %(kind)s)
RETURNING id
