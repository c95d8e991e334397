"""The GET handlers: every page and the fragments its live parts refresh.

Counts come from ``stats()`` (estimates labelled), aggregates from the shared
cache, searches from ``find_jobs`` within the search window. Nothing here
writes."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

import leaseq

from .._timeline import timeline
from .context import Context, handler
from .data import BLOCKED_KEYS_READ, FAILED_GROUPS_SHOWN
from .forms import STATES, JobFilter, digits, failed_group, settings_text
from .views import Chart, chart, percent, queue_name

#: Jobs per page of the Jobs list; running jobs shown at most on the Running page.
PAGE_SIZE = 50
#: find_jobs' largest page, for a search whose pages hold candidates only (a Failed
#: group's jobs: the error text's substring, then its exact text).
GROUP_SEARCH_PAGE = 1000
RUNNING_LIMIT = 200
#: The most queues the Overview shows: those with the most failed, then queued
#: and running jobs (by name among equals). Each shown queue costs a settings
#: read and a card (~10 kB, its hour drawn by minute); the Jobs page's filter
#: reaches the others.
OVERVIEW_QUEUES = 50
AUDIT_PAGE = 50


@dataclass(frozen=True, slots=True)
class QueueView:
    """One queue's row of the Overview."""

    stats: leaseq.QueueStats
    settings: leaseq.QueueSettings | None
    activity: leaseq.QueueActivity | None
    chart: Chart | None
    jobs_full: int | None
    bytes_full: int | None
    #: Keys of this queue held by a failed head (among those the summary read).
    blocked_keys: int = 0
    blocked_keys_capped: bool = False

    @property
    def name(self) -> str:
        return self.stats.queue

    def count(self, state: str) -> tuple[int, bool]:
        """A state's count and whether it is an estimate."""
        status = leaseq.JobStatus(state)
        return self.stats.counts.get(status, 0), status in self.stats.estimated


@asynccontextmanager
async def _together() -> AsyncIterator[asyncio.TaskGroup]:
    """Loads run side by side; the first to fail cancels the others, and its error is
    the page's. (``gather`` leaves the others running: with the database away each
    would wait out a connect timeout on the pool, and the next page behind them.)"""
    try:
        async with asyncio.TaskGroup() as group:
            yield group
    except BaseExceptionGroup as failed:
        raise failed.exceptions[0] from None


def _needing_attention(stats: list[leaseq.QueueStats]) -> list[leaseq.QueueStats]:
    """The OVERVIEW_QUEUES queues with the most failed, then queued and running jobs."""

    def rank(queue: leaseq.QueueStats) -> tuple[int, int, str]:
        counts = queue.counts
        active = counts.get(leaseq.JobStatus.QUEUED, 0) + counts.get(leaseq.JobStatus.RUNNING, 0)
        return (-counts.get(leaseq.JobStatus.FAILED, 0), -active, queue.queue)

    return sorted(stats, key=rank)[:OVERVIEW_QUEUES]


@dataclass(frozen=True, slots=True)
class QueueViews:
    """The Overview's queues: the cards shown, out of how many, and the warnings."""

    shown: list[QueueView]
    total: int
    warnings: tuple[str, ...]


async def _queue_views(ctx: Context) -> QueueViews:
    aggregates = ctx.dashboard.aggregates
    async with _together() as group:
        loading_stats = group.create_task(aggregates.stats())
        loading_health = group.create_task(aggregates.health())
        loading_blocked = group.create_task(aggregates.blocked_keys(None))
        loading_schedules = group.create_task(aggregates.schedules())
    every_queue = loading_stats.result()
    health, blocked = loading_health.result(), loading_blocked.result()
    stats = _needing_attention(every_queue)
    blocked_by_queue = Counter(key.queue for key in blocked[:BLOCKED_KEYS_READ])
    # The summary reads one key more than it lists: there are more. It holds the
    # newest failures of all queues: then each shown queue's own summary counts its
    # keys (else a queue whose failures are older would show none).
    blocked_capped = len(blocked) > BLOCKED_KEYS_READ
    async with _together() as group:
        loading = [group.create_task(aggregates.settings(s.queue)) for s in stats]
        loading_keys = (
            [group.create_task(aggregates.blocked_keys(s.queue)) for s in stats]
            if blocked_capped
            else []
        )
        # Every queue's hour in one statement, unless most would not be shown.
        loading_activity = group.create_task(
            aggregates.activity()
            if len(stats) == len(every_queue)
            else aggregates.activity_of([s.queue for s in stats])
        )
    settings = [task.result() for task in loading]
    activity = loading_activity.result()
    capped_queues: set[str] = set()
    if blocked_capped:
        own = {s.queue: task.result() for s, task in zip(stats, loading_keys, strict=True)}
        blocked_by_queue = Counter({q: min(len(k), BLOCKED_KEYS_READ) for q, k in own.items()})
        capped_queues = {q for q, k in own.items() if len(k) > BLOCKED_KEYS_READ}
    views = []
    for queue_stats, queue_settings in zip(stats, settings, strict=True):
        recent = activity.get(queue_stats.queue)
        views.append(
            QueueView(
                stats=queue_stats,
                settings=queue_settings,
                activity=recent,
                chart=chart(recent.per_minute) if recent is not None else None,
                jobs_full=percent(queue_settings.backlog_jobs, queue_settings.max_queued_jobs)
                if queue_settings
                else None,
                bytes_full=percent(queue_settings.backlog_bytes, queue_settings.max_queued_bytes)
                if queue_settings
                else None,
                blocked_keys=blocked_by_queue[queue_stats.queue],
                blocked_keys_capped=queue_stats.queue in capped_queues,
            )
        )
    stalled = [s.name for s in loading_schedules.result() if s.stalled]
    return QueueViews(
        shown=sorted(views, key=lambda v: v.name),
        total=len(every_queue),
        warnings=(*health.warnings, *_stalled_warning(stalled)),
    )


def _stalled_warning(names: list[str]) -> tuple[str, ...]:
    if not names:
        return ()
    listed = ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
    return (
        f"{len(names)} schedule(s) overdue by more than a minute ({listed}): no running "
        "worker declares them (taken out of the app? remove them on the Schedules page), "
        "or their queue is full.",
    )


@handler()
async def overview(request: Request, ctx: Context) -> Response:
    return await _render_overview(ctx, "overview.html")


@handler()
async def overview_live(request: Request, ctx: Context) -> Response:
    return await _render_overview(ctx, "_overview_live.html")


async def _render_overview(ctx: Context, template: str) -> Response:
    """The Overview page, or its live part (the same views, refreshed)."""
    views = await _queue_views(ctx)
    return ctx.render(
        template, queues=views.shown, total=views.total, warnings=views.warnings, states=STATES
    )


@handler()
async def jobs(request: Request, ctx: Context) -> Response:
    dashboard = ctx.dashboard
    queues = await dashboard.aggregates.queue_names()
    try:
        found = JobFilter.read(request.query_params)
        arguments = found.arguments(dashboard.mask)
    except leaseq.InvalidArgument as exc:
        empty = JobFilter()
        return ctx.render(
            "jobs.html", status=400, filter=empty, page=None, queues=queues, error=str(exc)
        )
    if found.digest:
        page = await _group_page(ctx, arguments, failed_group("", found.digest))
    else:
        page = await dashboard.client.find_jobs(
            **arguments, limit=PAGE_SIZE, window=dashboard.search_window
        )
    return ctx.render("jobs.html", filter=found, page=page, queues=queues, error=None)


async def _group_page(
    ctx: Context, arguments: dict[str, Any], member: Callable[[leaseq.Job], bool]
) -> leaseq.JobPage:
    """A page of the jobs ``find_jobs(**arguments)`` finds that are ``member``s: a
    Failed page group's, whose error text ``find_jobs`` matches as a substring only
    (its own search narrows, this keeps the group's)."""
    found: list[leaseq.Job] = []
    before, top = arguments["before"], arguments["window_top"]
    window_end = False
    while True:
        page = await ctx.dashboard.client.find_jobs(
            **{**arguments, "before": before, "window_top": top},
            limit=GROUP_SEARCH_PAGE,
            window=ctx.dashboard.search_window,
        )
        window_end = window_end or page.window_end
        top = top or page.window_top  # (one window for all the pages read)
        found += [job for job in page.jobs if member(job)]
        if len(found) > PAGE_SIZE:
            shown = tuple(found[:PAGE_SIZE])
            return leaseq.JobPage(jobs=shown, next_before=shown[-1].job_id, window_top=top)
        if page.next_before is None:
            return leaseq.JobPage(
                jobs=tuple(found), next_before=None, window_end=window_end, window_top=top
            )
        before = page.next_before


async def _job(ctx: Context, job_id: int) -> dict[str, Any]:
    job = await ctx.dashboard.client.get(job_id)
    return {
        "job": job,
        "timeline": timeline(job),
        "payload": ctx.dashboard.mask.pretty(job.payload),
    }


@handler()
async def job(request: Request, ctx: Context) -> Response:
    return ctx.render("job.html", **await _job(ctx, request.path_params["job_id"]))


@handler()
async def job_live(request: Request, ctx: Context) -> Response:
    return ctx.render("_job_live.html", **await _job(ctx, request.path_params["job_id"]))


@handler()
async def failed(request: Request, ctx: Context) -> Response:
    queue = request.query_params.get("queue") or None
    summary = await ctx.dashboard.aggregates.failed_groups(queue)
    queues = await ctx.dashboard.aggregates.queue_names()
    return ctx.render(
        "failed.html",
        summary=summary,
        # The largest groups; one more was read, to say when others are left out.
        groups=summary.groups[:FAILED_GROUPS_SHOWN],
        more_groups=len(summary.groups) > FAILED_GROUPS_SHOWN,
        queue=queue or "",
        queues=queues,
    )


@handler()
async def blocked(request: Request, ctx: Context) -> Response:
    queue = request.query_params.get("queue") or None
    keys = await ctx.dashboard.aggregates.blocked_keys(queue)
    queues = await ctx.dashboard.aggregates.queue_names()
    return ctx.render(
        "blocked.html",
        # One more was read than is listed, to say when others are left out.
        keys=keys[:BLOCKED_KEYS_READ],
        more=len(keys) > BLOCKED_KEYS_READ,
        queue=queue or "",
        queues=queues,
    )


async def _running(ctx: Context, queue: str | None) -> dict[str, Any]:
    # One more than shown, to tell that there are more. Expired leases come first
    # (the library's order): they are what needs attention (recovery pending).
    running = await ctx.dashboard.aggregates.running(queue, RUNNING_LIMIT + 1)
    return {
        "running": running[:RUNNING_LIMIT],
        "more": len(running) > RUNNING_LIMIT,
        "queue": queue or "",
    }


@handler()
async def running(request: Request, ctx: Context) -> Response:
    queue = request.query_params.get("queue") or None
    queues = await ctx.dashboard.aggregates.queue_names()
    return ctx.render("running.html", queues=queues, **await _running(ctx, queue))


@handler()
async def running_live(request: Request, ctx: Context) -> Response:
    queue = request.query_params.get("queue") or None
    return ctx.render("_running_live.html", **await _running(ctx, queue))


@handler()
async def audit(request: Request, ctx: Context) -> Response:
    queue = request.query_params.get("queue") or None
    before_text = request.query_params.get("before", "")
    if before_text and not digits(before_text):
        raise leaseq.InvalidArgument("before must be an audit entry id")
    before = int(before_text) if before_text else None
    entries = await ctx.dashboard.client.audit_log(queue=queue, before=before, limit=AUDIT_PAGE)
    older = entries[-1].audit_id if len(entries) == AUDIT_PAGE else None
    details = [ctx.dashboard.mask.mask(entry.detail) for entry in entries]
    queues = await ctx.dashboard.aggregates.queue_names()
    return ctx.render(
        "audit.html",
        entries=list(zip(entries, details, strict=True)),
        older=older,
        queue=queue or "",
        queues=queues,
    )


@handler()
async def schedules(request: Request, ctx: Context) -> Response:
    return ctx.render("schedules.html", schedules=await ctx.dashboard.client.schedules())


async def settings_page(
    ctx: Context, name: str, *, form: dict[str, str] | None = None, error: str | None = None
) -> Response:
    """The settings form of queue ``name``: its current values, or what the user
    typed with the error that kept it from being saved."""
    current = await ctx.dashboard.client.queue_settings(name)
    if current is None:
        return ctx.render(
            "error.html", status=404, heading="Not found", message=f"No queue named {name!r}."
        )
    values = {**settings_text(current), **(form or {})}
    # What the form showed, sent back with it: a save then changes only the fields
    # the operator edited (kept across a refused save: it shows what was typed).
    shown = (form or {}).get("shown") or json.dumps(settings_text(current))
    return ctx.render(
        "settings.html",
        status=400 if error else 200,
        queue=name,
        settings=current,
        values=values,
        shown=shown,
        error=error,
        policies=[p.value for p in leaseq.OrderingPolicy],
        modes=[m.value for m in leaseq.RetentionMode],
    )


@handler()
async def queue_settings(request: Request, ctx: Context) -> Response:
    return await settings_page(ctx, queue_name(request.path_params["name"]))


@handler(login=True)
async def login_form(request: Request, ctx: Context) -> Response:
    return ctx.render(
        "login.html", error=None, next=ctx.local(request.query_params.get("next", "/"))
    )
