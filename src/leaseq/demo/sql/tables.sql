-- The demo application's own tables, next to leaseq's in the demo schema.
CREATE TABLE IF NOT EXISTS {schema}.report_request (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    customer text NOT NULL,
    period text NOT NULL,
    kind text NOT NULL,
    job_id bigint,
    created_at timestamptz NOT NULL DEFAULT clock_timestamp()
);
-- One report per request: a retried job can never write a second one.
CREATE TABLE IF NOT EXISTS {schema}.report (
    report_id bigint PRIMARY KEY REFERENCES {schema}.report_request (id),
    html text NOT NULL,
    total numeric NOT NULL,
    lease_version bigint NOT NULL,
    created_at timestamptz NOT NULL DEFAULT clock_timestamp()
);
-- The stand-in notification service: every call, and what it delivered (once per key).
CREATE TABLE IF NOT EXISTS {schema}.notification_call (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    idempotency_key text NOT NULL,
    report_id bigint NOT NULL,
    at timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE TABLE IF NOT EXISTS {schema}.notification_delivery (
    idempotency_key text PRIMARY KEY,
    report_id bigint NOT NULL,
    at timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE TABLE IF NOT EXISTS {schema}.demo_flag (
    name text PRIMARY KEY,
    enabled boolean NOT NULL
);
