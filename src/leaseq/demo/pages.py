"""The demo service's HTML pages: the home page (request a report, the newest
requests, the dashboard) and a report's status while it is being made.

Plain HTML with a little CSS of its own, no script: every value is escaped.
"""

from __future__ import annotations

import html
from collections.abc import Iterable, Mapping
from typing import Any

#: The dashboard's path inside the demo service (see service.create_app).
DASHBOARD = "/dashboard"

_STYLE = """
body { font: 15px/1.5 system-ui, sans-serif; color: #1f2933; background: #f5f7fa;
       margin: 0; }
main { max-width: 52rem; margin: 2rem auto; padding: 0 1rem; }
h1 { font-size: 1.6rem; margin: 0 0 .25rem; }
h2 { font-size: 1.15rem; margin: 1.75rem 0 .5rem; }
p.lead { color: #52606d; margin: 0 0 1.25rem; }
section { background: #fff; border: 1px solid #d9e2ec; border-radius: 8px;
          padding: 1rem 1.25rem; margin-bottom: 1rem; }
form { display: flex; flex-wrap: wrap; gap: .75rem 1rem; align-items: end; }
label { display: flex; flex-direction: column; font-size: .85rem; color: #52606d; }
input, select, button { font: inherit; padding: .35rem .5rem; border: 1px solid #bcccdc;
                        border-radius: 6px; background: #fff; color: #1f2933; }
button { background: #2f6fde; border-color: #2f6fde; color: #fff; cursor: pointer;
         padding: .4rem 1rem; }
button:hover { background: #1f5bc4; }
.error { color: #a61b1b; background: #fde8e8; border: 1px solid #f5b5b5;
         border-radius: 6px; padding: .5rem .75rem; }
table { border-collapse: collapse; width: 100%; }
th, td { text-align: left; padding: .3rem .6rem; border-bottom: 1px solid #e4e7eb; }
th { font-size: .8rem; text-transform: uppercase; letter-spacing: .03em; color: #52606d; }
a { color: #2f6fde; }
.muted { color: #7b8794; }
.kind { font-size: .8rem; padding: .05rem .45rem; border-radius: 999px; background: #e4e7eb; }
.dash { display: inline-block; margin-top: .25rem; font-weight: 600; }
"""

KIND_NOTES = {
    "standard": "standard: made once, delivered once",
    "flaky": "flaky: fails twice, then succeeds (retries with backoff)",
    "broken": "broken: fails for good until the template is fixed (then replay it)",
    "ordered": "ordered: one customer's reports run in period order (ordering key)",
}


def _page(title: str, body: str, *, refresh: bool = False) -> str:
    meta = "<meta http-equiv='refresh' content='2'>" if refresh else ""
    return (
        "<!doctype html><html lang='en'><head><meta charset='utf-8'>"
        "<meta name='viewport' content='width=device-width, initial-scale=1'>"
        f"{meta}<title>{html.escape(title)}</title><style>{_STYLE}</style></head>"
        f"<body><main>{body}</main></body></html>"
    )


def home(
    recent: Iterable[tuple[Any, ...]],
    *,
    kinds: Iterable[str],
    fixed: bool,
    error: str | None = None,
    values: Mapping[str, str] | None = None,
) -> str:
    """The home page: the request form (with ``error`` and the ``values`` sent
    back when a request was refused), the newest requests, the dashboard's link."""
    values = values or {}
    customer = html.escape(values.get("customer", "acme"))
    period = html.escape(values.get("period", "2026-11"))
    chosen = values.get("kind", "standard")
    options = "".join(
        f"<option value='{html.escape(kind)}'{' selected' if kind == chosen else ''}>"
        f"{html.escape(KIND_NOTES.get(kind, kind))}</option>"
        for kind in kinds
    )
    problem = f"<p class='error' role='alert'>{html.escape(error)}</p>" if error else ""
    rows = "".join(_request_row(row) for row in recent)
    listing = (
        "<table><thead><tr><th>report</th><th>customer</th><th>period</th><th>kind</th>"
        f"<th>job</th><th>status</th></tr></thead><tbody>{rows}</tbody></table>"
        if rows
        else "<p class='muted'>No report requested yet.</p>"
    )
    body = f"""
<h1>leaseq demo: report service</h1>
<p class='lead'>Each request saves a row and its job in one transaction; worker
processes make the report and complete the job in the transaction that writes it.</p>
<section>
  <h2 style='margin-top:0'>Request a report</h2>
  {problem}
  <form method='post' action='/reports' data-testid='request-form'>
    <label>customer <input name='customer' value='{customer}' required maxlength='64'></label>
    <label>period <input name='period' value='{period}' required pattern='\\d{{4}}-\\d{{2}}'
      placeholder='YYYY-MM' size='8'></label>
    <label>kind <select name='kind'>{options}</select></label>
    <button type='submit'>Request report</button>
  </form>
</section>
<section>
  <h2 style='margin-top:0'>The <code>broken</code> kind's template</h2>
  {_template(fixed)}
</section>
<section>
  <h2 style='margin-top:0'>Operate the queue</h2>
  <a class='dash' href='{DASHBOARD}/' data-testid='dashboard-link'>Open the leaseq dashboard
  &rarr;</a>
  <p class='muted'>Jobs by state, throughput, failed jobs grouped by error, blocked keys,
  running jobs and their leases; replay, cancel, pause, with an audit trail.</p>
</section>
<h2>Newest requests</h2>
<section>{listing}</section>
"""
    return _page("leaseq demo", body)


def _template(fixed: bool) -> str:
    if fixed:
        state = "<strong>fixed</strong>: broken reports succeed."
        button = "<input type='hidden' name='fixed' value='0'><button>Break it again</button>"
    else:
        state = (
            "<strong>missing</strong>: broken reports fail for good and wait, failed, in the"
            f" dashboard's <a href='{DASHBOARD}/failed'>Failed</a> page. Fix it, then replay"
            " them there."
        )
        button = "<input type='hidden' name='fixed' value='1'><button>Fix the template</button>"
    return (
        f"<form method='post' action='/template' data-testid='template-form'>"
        f"<span>The template is {state}</span>{button}</form>"
    )


def _request_row(row: tuple[Any, ...]) -> str:
    report_id, customer, period, kind, job_id, has_report = row
    status = (
        f"<a href='/reports/{report_id}/html'>report</a>"
        if has_report
        else f"<a href='/reports/{report_id}'>status</a>"
    )
    job = f"<a href='{DASHBOARD}/jobs/{job_id}'>#{job_id}</a>" if job_id is not None else ""
    return (
        f"<tr><td><a href='/reports/{report_id}'>{report_id}</a></td>"
        f"<td>{html.escape(str(customer))}</td><td>{html.escape(str(period))}</td>"
        f"<td><span class='kind'>{html.escape(str(kind))}</span></td>"
        f"<td>{job}</td><td>{status}</td></tr>"
    )


def status(report_id: int, fields: Mapping[str, Any], job_id: int | None) -> str:
    """A report's status while it is not made yet (reloads every 2 s)."""
    rows = "".join(
        f"<tr><th>{html.escape(str(name))}</th><td>{html.escape(str(value))}</td></tr>"
        for name, value in fields.items()
    )
    job = (
        f" &middot; <a href='{DASHBOARD}/jobs/{job_id}'>job #{job_id} in the dashboard</a>"
        if job_id is not None
        else ""
    )
    lead = (
        "Its job failed for good: find it in the dashboard, fix the cause, replay it there."
        if fields.get("status") == "failed"
        else "Not made yet."
    )
    body = (
        f"<h1>Report {report_id}</h1>"
        f"<p class='lead'>{lead} This page reloads every 2 seconds.</p>"
        f"<section><table>{rows}</table></section>"
        f"<p><a href='/'>&larr; all reports</a>{job}</p>"
    )
    return _page(f"Report {report_id}", body, refresh=True)
