"""The POST handlers: every state change, through the library's fenced calls only,
each named in the audit log as ``dashboard:<principal>``; then back to the page
(post/redirect/get) with a message saying what happened.

A running job is never retried: a second run would start beside the first.
Cancelling it ends its claim through the lease fence (``cancel(running=True)``)."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any
from urllib.parse import parse_qsl

from starlette.requests import Request
from starlette.responses import Response

import leaseq

from . import replay_outcomes, security
from .context import Context, Dashboard, handler, refuse
from .forms import JobFilter, digits, edited, failed_group, group_search, settings_changes
from .pages import settings_page
from .views import queue_name, queue_path, retention

#: Ids per find_jobs call while collecting a bulk replay's jobs.
COLLECT_PAGE = 100
#: find_jobs' largest page, for a search whose pages hold candidates only (a Failed
#: group's jobs).
FULL_PAGE = 1000
#: The fields of a Jobs page's filter that a bulk replay reads.
FILTER_FIELDS = ("queue", "key", "error", "payload", "digest")
#: Job ids are PostgreSQL bigints.
MAX_JOB_ID = 2**63 - 1


async def _form(request: Request) -> dict[str, str]:
    form = await request.form()
    return {name: value for name, value in form.items() if isinstance(value, str)}


def _done(ctx: Context, form: dict[str, str], default: str, message: str) -> Response:
    ctx.dashboard.aggregates.cache.clear()  # the next page shows the action's effect
    return ctx.redirect(form.get("next") or default, message)


def _shown_version(form: dict[str, str]) -> int | None:
    """The job's lease_version as the page showed it (its form's ``lease_version``);
    None from a form without one (an older page, a script): status checks only."""
    text = form.get("lease_version")
    if text is None:
        return None
    if not digits(text) or int(text) > MAX_JOB_ID:
        raise leaseq.InvalidArgument("lease_version must be the job's lease version as shown")
    return int(text)


@handler(security.REPLAY, post=True)
async def replay(request: Request, ctx: Context) -> Response:
    job_id: int = request.path_params["job_id"]
    form = await _form(request)
    client = ctx.dashboard.client
    # A page that showed the job failed (its page, a blocked key's head) says so:
    # one skipped (cancelled) since then is left alone, checked on the locked row. A
    # replay would undo that skip, and put the job back in front of its key. The
    # lease_version it showed: one replayed since (run again, maybe failed again:
    # a failure the operator never saw) is left alone too, on the locked row.
    only_failed = form.get("only_failed") == "1"
    shown = _shown_version(form)
    try:
        if only_failed or shown is not None:
            versions = None if shown is None else [shown]
            replayed = bool(
                await client.replay_many(
                    [job_id], actor=ctx.actor, only_failed=only_failed, lease_versions=versions
                )
            )
        else:
            replayed = await client.replay(job_id, actor=ctx.actor)
    except (leaseq.BacklogFull, leaseq.UniqueKeyHeld) as exc:
        # Refusals of this job, not outages: said on the job's page, like any outcome.
        full = isinstance(exc, leaseq.BacklogFull)  # (its text counts jobs of a batch)
        # (UniqueKeyHeld's own text opens with "job N not replayed:" already.)
        said = f"Job {job_id} not replayed: its queue is full (admission limits)"
        return _done(ctx, form, f"/jobs/{job_id}", said if full else _capitalised(str(exc)))
    except leaseq.PayloadTooLarge:
        replayed = False  # said below, as the bulk form's refusal of it is
    if replayed:
        return _done(ctx, form, f"/jobs/{job_id}", f"Job {job_id} replayed: it is queued again.")
    message = await replay_outcomes.not_replayed(client, job_id, only_failed, shown)
    return _done(ctx, form, f"/jobs/{job_id}", message)


@handler(security.CANCEL, post=True)
async def cancel(request: Request, ctx: Context) -> Response:
    job_id: int = request.path_params["job_id"]
    form = await _form(request)
    running = form.get("running") == "1"
    client = ctx.dashboard.client
    # The library's cancel also cancels a failed job (a skip: its ordering key moves
    # on). The pages offer Cancel for queued and running jobs only: one that failed
    # since the page was shown is kept, failed, for replay or an explicit Skip.
    # (Checked just before the cancel; the library has no guard for it on the row.)
    if (await client.get(job_id)).status is leaseq.JobStatus.FAILED:
        return _done(
            ctx,
            form,
            f"/jobs/{job_id}",
            f"Job {job_id} failed meanwhile: not cancelled. Replay it, or skip it "
            "(Skip cancels a failed job and moves its ordering key on).",
        )
    if await client.cancel(job_id, running=running, actor=ctx.actor):
        # Worded from what the job was when the cancel took it (its history entry,
        # written from the locked row), not from the form: a run the Running page
        # showed may have ended meanwhile, the job queued again with no worker.
        was = _cancelled_from(await client.get(job_id))
        return _done(ctx, form, f"/jobs/{job_id}", _cancelled(job_id, was, running))
    job = await client.get(job_id)
    if job.status is leaseq.JobStatus.RUNNING:
        message = f"Job {job_id} is running: use “Cancel running job” to stop it."
    else:
        message = f"Job {job_id} is {job.status.value}: nothing to cancel."
    return _done(ctx, form, f"/jobs/{job_id}", message)


def _cancelled_from(job: leaseq.Job) -> str | None:
    """The status the job's latest cancel took it from (None if none is kept)."""
    for entry in reversed(job.history):
        if entry.get("outcome") == "cancelled":
            was = entry.get("previous_status")
            return was if isinstance(was, str) else None
    return None


def _cancelled(job_id: int, was: str | None, running: bool) -> str:
    """What a cancel of job ``job_id`` did, the job having been ``was``; ``running``:
    the form was a running job's (the Running page, a running job's page)."""
    if was == leaseq.JobStatus.RUNNING.value:
        told = "Its worker is told to stop; whatever it reports now is refused."
        return f"Job {job_id} cancelled. {told}"
    if was == leaseq.JobStatus.FAILED.value:  # (between the check above and the cancel)
        return f"Job {job_id} cancelled: it had failed just before the cancel took it."
    if was == leaseq.JobStatus.QUEUED.value and running:
        return f"Job {job_id} cancelled: it was queued (its run had ended), no worker held it."
    return f"Job {job_id} cancelled."


@handler(security.CANCEL, post=True)
async def skip(request: Request, ctx: Context) -> Response:
    """Skip a blocked key's failed head: it becomes cancelled and the key moves on."""
    job_id: int = request.path_params["job_id"]
    form = await _form(request)
    shown = _shown_version(form)
    client = ctx.dashboard.client
    job = await client.get(job_id)
    if job.status is not leaseq.JobStatus.FAILED:
        return _done(
            ctx, form, "/blocked", f"Job {job_id} is {job.status.value}, not a failed head."
        )
    # Only while it is failed, and (from a page) the failure the page showed: its
    # lease_version. Both checked on the locked row: a job someone replayed since
    # the look above stays queued, and one that ran and failed again since stays
    # failed (its new failure was never shown).
    if not await client.cancel(job_id, only_failed=True, lease_version=shown, actor=ctx.actor):
        now = await client.get(job_id)
        message = (
            replay_outcomes.changed(job_id, now, "Nothing skipped")
            if shown is not None and now.lease_version != shown
            else f"Job {job_id} changed meanwhile: nothing skipped."
        )
        return _done(ctx, form, "/blocked", message)
    if job.key is None:  # (no key to move on: a hand-made request; cancelled all the same)
        message = f"Cancelled failed job {job_id} (it has no ordering key)."
    else:
        message = f"Skipped job {job_id}, the head of key {job.key!r}: the key's next job can run."
    return _done(ctx, form, "/blocked", message)


@handler(security.REPLAY, post=True)
async def replay_matching(request: Request, ctx: Context) -> Response:
    """Step one of a bulk replay: find the failed jobs matching the filter, or those
    of a Failed page's group (``group=1``: its exact error text), at most
    ``bulk_limit``, and ask for confirmation, showing exactly how many."""
    form = _filter_fields(await _form(request))
    dashboard = ctx.dashboard
    try:
        found = JobFilter.read({**form, "state": "failed", "before": ""})
        arguments = found.arguments(dashboard.mask)
    except leaseq.InvalidArgument as exc:
        return refuse(ctx, 400, str(exc))
    group = form.get("group") == "1"
    member = None
    if group:
        # The group's text as sent (not stripped): an empty one is the group of
        # jobs without an error text, never "any error".
        error = form.get("error", "")
        digest = form.get("digest", "")
        if digest and not re.fullmatch(r"[0-9a-f]{64}", digest):
            return refuse(ctx, 400, "digest must be the group's 64 hexadecimal digits")
        member = failed_group(error, digest)
        arguments["error"] = group_search(error)
    found_jobs, more, window_end = await _failed_jobs(dashboard, arguments, member)
    return ctx.render(
        "confirm_replay.html",
        filter=found,
        group=group,
        ids=[job.job_id for job in found_jobs],
        # What each job was when shown: confirming leaves alone one that moved on.
        versions=[job.lease_version for job in found_jobs],
        more=more,
        window_end=window_end,
        back=ctx.local(form.get("next") or f"/jobs?{found.query()}"),
    )


def _filter_fields(form: dict[str, str]) -> dict[str, str]:
    """The form with its filter: a Jobs page sends its filter as a query string
    (``filter``), which comes back exactly as the page had it. Its fields sent one
    by one as hidden fields, a browser would change their line breaks: its HTML
    parser reads a CR as LF and it sends LF as CRLF, and the ordering key "a\\nb"
    would come back as "a\\r\\nb", another key, whose jobs the replay would take."""
    if "filter" not in form:
        return form  # (a Failed page's group: its digest keeps its text exact)
    shown = dict(parse_qsl(form["filter"], keep_blank_values=True))
    kept = {name: value for name, value in form.items() if name not in FILTER_FIELDS}
    return {**kept, **{name: shown.get(name, "") for name in FILTER_FIELDS}}


async def _failed_jobs(
    dashboard: Dashboard, arguments: dict[str, Any], member: Callable[[leaseq.Job], bool] | None
) -> tuple[list[leaseq.Job], bool, bool]:
    """The newest failed jobs ``find_jobs(**arguments)`` finds that are ``member``s (if
    given), at most ``bulk_limit``; whether more match; whether the search stopped
    at the edge of its window."""
    limit = dashboard.bulk_limit
    found: list[leaseq.Job] = []
    before: int | None = None
    top: int | None = None
    window_end = False
    while True:
        page = await dashboard.client.find_jobs(
            **{**arguments, "before": before, "window_top": top},
            limit=FULL_PAGE if member else min(COLLECT_PAGE, limit - len(found)),
            window=dashboard.search_window,
        )
        window_end = window_end or page.window_end
        top = top or page.window_top  # (one window for all the pages read)
        matching = [job for job in page.jobs if member is None or member(job)]
        room = limit - len(found)
        found += matching[:room]
        if len(matching) > room:
            return found, True, window_end
        if page.next_before is None:
            return found, False, window_end
        if member is None and len(found) == limit:
            return found, True, window_end  # find_jobs says more follow
        before = page.next_before


@handler(security.REPLAY, post=True)
async def replay_confirmed(request: Request, ctx: Context) -> Response:
    """Step two: replay the jobs the confirmation showed that are still failed and
    as they were shown (one replayed, or skipped, meanwhile is left alone)."""
    form = await _form(request)
    shown = _shown_jobs(form.get("ids", ""), form.get("versions"))
    if shown is None:
        return refuse(ctx, 400, "The list of jobs to replay is malformed.")
    ids, versions = shown
    if len(ids) > ctx.dashboard.bulk_limit:
        return refuse(ctx, 400, f"At most {ctx.dashboard.bulk_limit:,} jobs per replay.")
    back = form.get("next") or "/failed"
    try:
        # Only those still failed, checked on each locked row: a job replayed, or
        # skipped, since the confirmation was shown is left as it is.
        # and whose lease_version is still the one shown: a job replayed since, run
        # again and failed again is failed, but not the failure that was confirmed.
        replayed = await ctx.dashboard.client.replay_many(
            ids, actor=ctx.actor, only_failed=True, lease_versions=versions
        )
    except leaseq.BacklogFull as exc:
        message = f"Replayed {len(exc.replayed):,} of {len(ids):,} jobs, then: {exc}"
        return _done(ctx, form, back, message)
    done = set(replayed)
    left = [job_id for job_id in ids if job_id not in done]
    tail = await replay_outcomes.left_alone(ctx.dashboard.client, left, ids, versions)
    return _done(ctx, form, back, f"Replayed {len(replayed):,} of {len(ids):,} jobs{tail}.")


def _numbers(text: str) -> list[int] | None:
    """``"12,7,9"`` as numbers, or None if any is not one."""
    texts = [part.strip() for part in text.split(",") if part.strip()]
    if not all(digits(part) for part in texts):
        return None
    return [int(part) for part in texts]


def _shown_jobs(ids: str, versions: str | None) -> tuple[list[int], list[int] | None] | None:
    """The confirmation's ``ids`` (``"12,7,9"``, each kept once) and, if it sent
    them, their ``versions`` (the lease_version of each as shown, in the same
    order); None if either is malformed."""
    job_ids = _numbers(ids)
    if job_ids is None or not all(0 < job_id <= MAX_JOB_ID for job_id in job_ids):
        return None
    if versions is None:  # a form of an older page, or a script: status checks only
        return list(dict.fromkeys(job_ids)), None
    seen = _numbers(versions)
    if seen is None or len(seen) != len(job_ids) or not all(v <= MAX_JOB_ID for v in seen):
        return None
    pairs = dict(zip(job_ids, seen, strict=True))  # (an id twice: its last version)
    return list(pairs), list(pairs.values())


async def _pause(request: Request, ctx: Context, paused: bool) -> Response:
    name = queue_name(request.path_params["name"])
    form = await _form(request)
    if await ctx.dashboard.client.queue_settings(name) is None:
        return refuse(ctx, 404, f"No queue named {name!r}.")
    await ctx.dashboard.client.configure_queue(name, paused=paused, actor=ctx.actor)
    what = "paused: workers claim none of its jobs" if paused else "resumed"
    return _done(ctx, form, queue_path(name), f"Queue {name} {what}.")


@handler(security.PAUSE, post=True)
async def pause(request: Request, ctx: Context) -> Response:
    return await _pause(request, ctx, True)


@handler(security.PAUSE, post=True)
async def resume(request: Request, ctx: Context) -> Response:
    return await _pause(request, ctx, False)


@handler(security.CONFIGURE, post=True)
async def remove_schedule(request: Request, ctx: Context) -> Response:
    """Remove a schedule the app no longer declares (the page offers it for those
    no running worker handles): its row and bookkeeping; its jobs stay."""
    form = await _form(request)
    name = form.get("name", "")
    client = ctx.dashboard.client
    # Only a stalled one, as the page offers: a page loaded while the workers were
    # down, clicked once they are back, must not take a live schedule away from the
    # worker that ticks it.
    shown = [s for s in await client.schedules() if s.name == name]
    if shown and not shown[0].stalled:
        return refuse(
            ctx,
            409,
            f"Schedule {name} is not overdue: a running worker declares it. "
            "Only a schedule overdue by more than a minute is removed here.",
        )
    if not await client.remove_schedule(name, actor=ctx.actor):
        return refuse(ctx, 404, f"No schedule named {name!r}.")
    return _done(
        ctx,
        form,
        "/schedules",
        f"Schedule {name} removed; the jobs it enqueued stay. "
        "A worker started with it in its app declares it again.",
    )


def _shown(name: str, value: Any) -> str:
    if name.startswith(("retain_", "lease", "backoff_")):
        return retention(value)
    if name.startswith("rate_limit") and value is not None:
        return f"{value[0]}/{retention(value[1])}"
    return "no limit" if value is None else str(value)


@handler(security.CONFIGURE, post=True)
async def configure(request: Request, ctx: Context) -> Response:
    """Save the settings form: only what changed; bad input is shown with the
    form as typed and nothing is written."""
    name = queue_name(request.path_params["name"])
    form = await _form(request)
    client = ctx.dashboard.client
    current = await client.queue_settings(name)
    if current is None:
        return refuse(ctx, 404, f"No queue named {name!r}.")
    typed = {k: v for k, v in form.items() if k not in ("csrf", "next")}
    try:
        changes = settings_changes(edited(typed), current)
        if changes:
            await client.configure_queue(name, actor=ctx.actor, **changes)
    except leaseq.InvalidArgument as exc:
        return await settings_page(ctx, name, form=typed, error=str(exc))
    if not changes:
        return _done(ctx, form, queue_path(name), "Nothing changed.")
    said = ", ".join(
        f"{key} {_shown(key, getattr(current, key))} → {_shown(key, value)}"
        for key, value in changes.items()
    )
    return _done(ctx, form, queue_path(name), f"Saved {name}: {said}.")


@handler(login=True, post=True)
async def login(request: Request, ctx: Context) -> Response:
    auth = ctx.dashboard.auth
    form = await _form(request)
    if not isinstance(auth, security.TokenAuth):
        return refuse(ctx, 404, "This dashboard has no login form.")
    asked = ctx.local(form.get("next") or "/")  # (the page the form was met on)
    if not auth.check_token(form.get("token", "").strip()):
        error = "That token is not the right one."
        return ctx.render("login.html", status=401, error=error, next=asked)
    response = ctx.redirect(asked)
    response.set_cookie(
        security.LOGIN_COOKIE,
        auth.login_cookie(),
        max_age=security.LOGIN_SECONDS,
        # Lax, so that a link to the dashboard from elsewhere opens it signed in; every
        # state change still needs the form token of the session cookie, which no
        # cross-site POST carries (Lax).
        samesite="lax",
        **security.cookie_options(request),
    )
    return response


@handler(post=True)
async def logout(request: Request, ctx: Context) -> Response:
    response = ctx.redirect("/")
    response.delete_cookie(
        security.LOGIN_COOKIE, samesite="lax", **security.cookie_options(request)
    )
    return response


def _capitalised(text: str) -> str:
    """A library message ("job 7 not replayed: ...") as the page's sentences start."""
    return text[:1].upper() + text[1:]
