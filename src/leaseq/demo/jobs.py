"""The demo's worker side: `leaseq worker leaseq.demo.jobs:app`."""

from __future__ import annotations

import leaseq

from . import QUEUE, SCHEMA, reports, sql

app = leaseq.App(schema=SCHEMA)


class WarehouseTimeout(Exception):
    """The kind of hiccup that goes away on retry."""


class TemplateMissing(leaseq.PermanentError):
    """A bug: retrying cannot help until someone fixes it (the `fixed` flag)."""


@app.task(QUEUE, max_attempts=5, backoff=(0.2, 2.0), lease=5)
def generate_report(job: leaseq.JobContext) -> None:
    request = job.payload
    kind = request["kind"]
    if kind == "flaky" and job.attempts <= 2:
        raise WarehouseTimeout(f"warehouse timed out (attempt {job.attempts})")
    with job.connection() as conn:
        fixed = sql.fetch(conn, "get_flag", name="fixed")[0][0]
    if kind == "broken" and not fixed:
        # (Not naming the kind: a payload value is masked in the stored error.)
        raise TemplateMissing("the report template is missing")
    report = reports.build(request["customer"], request["period"])
    if job.lost.is_set():
        return  # this attempt no longer owns the job: do not notify, do not write
    # An outside effect: at least once, made safe by the stable idempotency key.
    with job.connection() as conn:
        sql.fetch(conn, "notify", key=job.idempotency_key, report_id=request["report_id"])
    # The effect in this database and the fenced completion commit together.
    with job.transaction() as conn:
        sql.fetch(
            conn,
            "insert_report",
            report_id=request["report_id"],
            html=reports.to_html(report),
            total=report.total,
            lease_version=job.lease_version,
        )
