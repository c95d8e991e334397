-- The stand-in notification service: it records every call and delivers each
-- idempotency key once, as a real provider with idempotency support would.
WITH called AS (
    INSERT INTO {schema}.notification_call (idempotency_key, report_id)
    VALUES (%(key)s, %(report_id)s)
)
INSERT INTO {schema}.notification_delivery (idempotency_key, report_id)
VALUES (%(key)s, %(report_id)s)
ON CONFLICT (idempotency_key) DO NOTHING
