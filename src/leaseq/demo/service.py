"""The demo's HTTP service: save a report request and its job in one transaction."""

from __future__ import annotations

import os
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from starlette.routing import Mount, Route

import leaseq
from leaseq.web import create_app as create_dashboard

from . import QUEUE, SCHEMA, pages, sql

KINDS = ("standard", "flaky", "broken", "ordered")
CUSTOMER = re.compile(r"[A-Za-z0-9][A-Za-z0-9 _.-]{0,63}")
PERIOD = re.compile(r"(\d{4})-(0[1-9]|1[0-2])")


class Invalid(Exception):
    pass


def parse(body: Any) -> tuple[str, str, str]:
    """customer, period (YYYY-MM) and kind, or Invalid with a clear message."""
    if not isinstance(body, dict):
        raise Invalid("expected a JSON object with customer, period and kind")
    unknown = set(body) - {"customer", "period", "kind"}
    if unknown:
        raise Invalid(f"unknown fields: {', '.join(sorted(unknown))}")
    customer, period, kind = body.get("customer"), body.get("period"), body.get("kind", "standard")
    if not isinstance(customer, str) or not CUSTOMER.fullmatch(customer):
        raise Invalid(
            "customer: 1-64 letters, digits, spaces, _ . - (starting with a letter/digit)"
        )
    if not isinstance(period, str) or not PERIOD.fullmatch(period):
        raise Invalid("period: a month as YYYY-MM")
    if kind not in KINDS:
        raise Invalid(f"kind: one of {', '.join(KINDS)}")
    return customer, period, kind


def create_app(database_url: str) -> Starlette:
    """The report service, with the leaseq dashboard mounted at /dashboard."""
    queue = leaseq.AsyncQueue(database_url, schema=SCHEMA, pool_size=10)
    dashboard = create_dashboard(database_url, schema=SCHEMA, title="leaseq demo")

    @asynccontextmanager
    async def lifespan(_: Starlette) -> AsyncIterator[None]:
        # A mounted app's lifespan is its parent's to run: the dashboard's pool closes too.
        async with dashboard.router.lifespan_context(dashboard):
            yield
        await queue.close()

    async def submit(request: Request) -> Response:
        if _is_form(request):  # the home page's form: answer with pages, not JSON
            if not _same_origin(request):
                return HTMLResponse("cross-site form refused", status_code=403)
            values = {k: v for k, v in (await request.form()).items() if isinstance(v, str)}
            try:
                report_id = await _save(queue, *parse(values))
            except Invalid as exc:
                page = await _home_page(queue, error=str(exc), values=values)
                return HTMLResponse(page, status_code=422)
            return RedirectResponse(f"/reports/{report_id}", status_code=303)
        try:
            report_id = await _save(queue, *parse(await request.json()))
        except ValueError:
            return JSONResponse({"error": "the body is not valid JSON"}, status_code=422)
        except Invalid as exc:
            return JSONResponse({"error": str(exc)}, status_code=422)
        status_url = f"/reports/{report_id}"
        return JSONResponse(
            {"id": report_id, "status_url": status_url},
            status_code=202,
            headers={"Location": status_url},
        )

    async def home(_: Request) -> Response:
        return HTMLResponse(await _home_page(queue))

    async def template(request: Request) -> Response:
        """Fix (or break again) the `broken` kind's template: then replay its jobs."""
        if not _same_origin(request):
            return HTMLResponse("cross-site form refused", status_code=403)
        fixed = (await request.form()).get("fixed") == "1"
        await _fetch(queue, "set_flag", name="fixed", enabled=fixed)
        return RedirectResponse("/", status_code=303)

    async def status(request: Request) -> Response:
        report_id = _report_id(request)
        rows = await _fetch(queue, "get_request", id=report_id) if report_id else []
        if report_id is None or not rows:
            return JSONResponse({"error": "no such report"}, status_code=404)
        _, customer, period, kind, job_id, has_report = rows[0]
        job = await queue.get(job_id)
        body: dict[str, Any] = {
            "id": report_id,
            "customer": customer,
            "period": period,
            "kind": kind,
            "status": job.status.value,
            "attempts": job.attempts,
            "last_error": job.last_error,
        }
        if has_report:
            body["report_url"] = f"/reports/{report_id}/html"
        if "text/html" in request.headers.get("accept", ""):  # a browser: show the report
            if has_report:
                return await report_html(request)
            return HTMLResponse(pages.status(report_id, body, job_id))
        return JSONResponse(body)

    async def report_html(request: Request) -> Response:
        report_id = _report_id(request)
        rows = await _fetch(queue, "get_report_html", id=report_id) if report_id else []
        if not rows:
            return JSONResponse({"error": "no such report (yet)"}, status_code=404)
        return HTMLResponse(rows[0][0])

    async def health(_: Request) -> Response:
        return JSONResponse({"ok": True})

    async def favicon(_: Request) -> Response:  # the dashboard's icon, for every page
        return RedirectResponse(f"{pages.DASHBOARD}/static/favicon.svg", status_code=301)

    return Starlette(
        routes=[
            Route("/", home),
            Route("/health", health),
            Route("/favicon.ico", favicon),
            Route("/reports", submit, methods=["POST"]),
            Route("/template", template, methods=["POST"]),
            Route("/reports/{report_id}", status),
            Route("/reports/{report_id}/html", report_html),
            Mount(pages.DASHBOARD, app=dashboard),
        ],
        lifespan=lifespan,
    )


async def _save(queue: leaseq.AsyncQueue, customer: str, period: str, kind: str) -> int:
    """The request row and its job, in one transaction; the request's id."""
    async with queue.connection() as conn, conn.transaction():
        rows = await sql.afetch(conn, "insert_request", customer=customer, period=period, kind=kind)
        report_id = int(rows[0][0])
        payload = {"report_id": report_id, "customer": customer, "period": period, "kind": kind}
        ordering: dict[str, Any] = {}
        if kind == "ordered":  # one customer's ordered reports run in period order
            year, month = PERIOD.fullmatch(period).groups()  # type: ignore[union-attr]
            ordering = {"key": customer, "seq": int(year) * 12 + int(month)}
        job_id = await queue.enqueue(QUEUE, payload, conn=conn, **ordering)
        await sql.afetch(conn, "set_request_job", id=report_id, job_id=job_id)
    return report_id


async def _home_page(queue: leaseq.AsyncQueue, **options: Any) -> str:
    """The home page, with the newest requests and the template's state."""
    async with queue.connection() as conn:
        recent = await sql.afetch(conn, "recent_requests", limit=20)
        fixed = bool((await sql.afetch(conn, "get_flag", name="fixed"))[0][0])
    return pages.home(recent, kinds=KINDS, fixed=fixed, **options)


def app_from_environment() -> Starlette:
    """For `uvicorn --factory`: the database comes from LEASEQ_DEMO_DATABASE_URL."""
    return create_app(os.environ["LEASEQ_DEMO_DATABASE_URL"])


def _report_id(request: Request) -> int | None:
    text = request.path_params["report_id"]
    # (ASCII only: str.isdigit() also accepts "²", which int() refuses)
    return int(text) if text.isascii() and text.isdigit() and len(text) < 18 else None


def _is_form(request: Request) -> bool:
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    return kind in {"application/x-www-form-urlencoded", "multipart/form-data"}


def _same_origin(request: Request) -> bool:
    """A form post from one of our own pages (a browser names where it posts from)."""
    if request.headers.get("sec-fetch-site", "same-origin") not in {"same-origin", "none"}:
        return False
    origin = request.headers.get("origin")
    return origin is None or origin == f"{request.url.scheme}://{request.url.netloc}"


async def _fetch(queue: leaseq.AsyncQueue, file: str, **params: object) -> sql.Rows:
    async with queue.connection() as conn:
        return await sql.afetch(conn, file, **params)
