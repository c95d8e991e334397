-- What the demo's closing table reports, in one round trip.
SELECT
    (SELECT count(*) FROM {schema}.report_request),
    (SELECT count(*) FROM {schema}.report),
    (SELECT count(*) FROM (SELECT report_id FROM {schema}.report
                           GROUP BY report_id HAVING count(*) > 1) AS d),
    (SELECT count(*) FROM {schema}.notification_call),
    (SELECT count(*) FROM {schema}.notification_delivery),
    (SELECT count(*) FROM (SELECT idempotency_key FROM {schema}.notification_delivery
                           GROUP BY idempotency_key HAVING count(*) > 1) AS d),
    (SELECT count(*) FROM (SELECT report_id FROM {schema}.notification_delivery
                           GROUP BY report_id HAVING count(*) > 1) AS d),
    -- Ordered reports finished out of their customer's period order.
    (SELECT count(*) FROM (
        SELECT rep.created_at < lag(rep.created_at) OVER (
                   PARTITION BY r.customer ORDER BY r.period) AS out_of_order
        FROM {schema}.report_request AS r
        JOIN {schema}.report AS rep ON rep.report_id = r.id
        WHERE r.kind = 'ordered') AS o
     WHERE o.out_of_order),
    (SELECT count(*) FROM {schema}.job AS j,
         jsonb_array_elements(j.history) AS h
     WHERE h ->> 'outcome' IN ('retry', 'lease_expired'))
