"""What every request handler shares: the app's :class:`Dashboard`, the request's
:class:`Context` (principal, session, CSRF token, flash message), rendering, and
the :func:`handler` wrapper that authenticates, checks cross-site requests and
permissions, and turns leaseq's errors into clear pages."""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import jinja2
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response

import leaseq

from .._logs import get_logger
from .._secret_fields import SecretMask
from . import security
from .data import Aggregates
from .security import Auth, Csrf, Principal

# leaseq's loggers scrub DSN passwords from messages and tracebacks.
log = get_logger("leaseq.web")


@dataclass
class Dashboard:
    """One app's configuration and shared parts (kept on ``app.state.leaseq``)."""

    client: leaseq.AsyncQueue
    aggregates: Aggregates
    csrf: Csrf
    auth: Auth | None
    read_only: bool
    mask: SecretMask
    search_window: int
    bulk_limit: int
    title: str
    templates: jinja2.Environment

    async def principal(self, request: Request) -> Principal | None:
        """Who is asking; without ``auth``, the local user with every permission."""
        if self.auth is None:
            found: Principal | None = Principal("local", security.PERMISSIONS)
        else:
            answer = self.auth(request)
            found = await answer if inspect.isawaitable(answer) else answer
        if found is not None and self.read_only:
            found = Principal(found.name, found.permissions & {security.READ})
        return found


class Context:
    """One request's view of the dashboard."""

    def __init__(self, request: Request, dashboard: Dashboard, principal: Principal | None):
        self.request = request
        self.dashboard = dashboard
        self.principal = principal or Principal("anonymous", frozenset())
        self.root = request.scope.get("root_path", "").rstrip("/")
        session = request.cookies.get(security.SESSION_COOKIE)
        self.new_session = not session
        self.session = session or security.new_session()
        self.csrf_token = dashboard.csrf.token(self.session)
        flash = request.cookies.get(security.FLASH_COOKIE)
        self.flash = dashboard.csrf.unsign(flash) if flash else None
        self._flash_seen = flash is not None

    @property
    def actor(self) -> str:
        """Who the audit log names for this request's actions."""
        return f"dashboard:{self.principal.name}"

    def url(self, path: str) -> str:
        return f"{self.root}{path}"

    @property
    def page_asked_for(self) -> str:
        """Where signing in leads: the page this request asked for (within the app,
        with its query), or the overview for an action or a live fragment, which
        a redirect after the login could not open."""
        path: str = self.request.scope["path"]
        if self.root and (path == self.root or path.startswith(f"{self.root}/")):
            path = path[len(self.root) :] or "/"
        if self.request.method != "GET" or path.startswith(("/live/", "/login", "/static/")):
            return "/"
        query = self.request.url.query
        return self.local(f"{path}?{query}" if query else path)

    def render(self, template: str, status: int = 200, **values: Any) -> Response:
        page = self.dashboard.templates.get_template(template).render(
            ctx=self, title=self.dashboard.title, **values
        )
        return self._finish(HTMLResponse(page, status_code=status))

    def redirect(self, path: str, flash: str | None = None) -> Response:
        """Post/redirect/get: back to ``path`` (ours only), with a message to show there."""
        response = RedirectResponse(self.url(self.local(path)), status_code=303)
        if flash:
            response.set_cookie(
                security.FLASH_COOKIE,
                self.dashboard.csrf.sign(flash),
                max_age=120,
                samesite="strict",
                **security.cookie_options(self.request),
            )
            self._flash_seen = False  # this response sets it: do not clear it too
        return self._finish(response)

    @staticmethod
    def local(path: str) -> str:
        """``path`` if it is a path of this app, else its root: a ``next`` field can
        never send anyone elsewhere. Browsers read a backslash as a slash and drop
        tabs and line breaks, so ``/\\evil.example`` is ``//evil.example`` to them:
        scheme-relative, another site. A path with either is refused."""
        if "\\" in path or any(ord(char) < 0x20 or ord(char) == 0x7F for char in path):
            return "/"
        parts = urlsplit(path)
        if parts.scheme or parts.netloc or not path.startswith("/") or path.startswith("//"):
            return "/"
        return path

    def _finish(self, response: Response) -> Response:
        options = security.cookie_options(self.request)
        if self.new_session:
            # Lax, not Strict: a link from another site (a chat, an alert e-mail)
            # must carry it, else that page starts a new session and every form
            # already open in other tabs fails its token. Lax keeps it out of
            # cross-site POSTs, which the form token and Origin checks refuse anyway.
            response.set_cookie(security.SESSION_COOKIE, self.session, samesite="lax", **options)
        if self._flash_seen:
            response.delete_cookie(security.FLASH_COOKIE, samesite="strict", **options)
        return response


Handler = Callable[[Request, Context], Awaitable[Response]]


def _unauthenticated(ctx: Context) -> Response:
    dashboard = ctx.dashboard
    if getattr(dashboard.auth, "login_form", False):
        return ctx.render("login.html", status=401, error=None, next=ctx.page_asked_for)
    response = ctx.render(
        "error.html", status=401, heading="Sign in needed", message="This dashboard needs auth."
    )
    if isinstance(dashboard.auth, security.BasicAuth):
        response.headers["www-authenticate"] = 'Basic realm="leaseq dashboard", charset="UTF-8"'
    return response


def refuse(ctx: Context, status: int, message: str) -> Response:
    headings = {
        400: "Not done",
        409: "Not done",
        403: "Not allowed",
        404: "Not found",
        500: "Error",
    }
    heading = headings.get(status, "Unavailable")
    return ctx.render("error.html", status=status, heading=heading, message=message)


def error_page(ctx: Context, exc: leaseq.LeaseqError) -> Response:
    """leaseq's typed errors as pages people can act on."""
    if isinstance(exc, leaseq.JobNotFound):
        return refuse(ctx, 404, str(exc) or "No job has this id.")
    if isinstance(exc, leaseq.InvalidArgument):
        return refuse(ctx, 400, str(exc))
    if isinstance(exc, leaseq.NotMigrated):
        return refuse(ctx, 503, f"The leaseq schema is not there yet: {exc}")
    if isinstance(exc, leaseq.StatementTimeout):
        return refuse(
            ctx,
            503,
            "The database took too long to answer (the dashboard's statement timeout). "
            "Try a narrower filter, or again in a moment.",
        )
    if isinstance(exc, leaseq.TransientError):
        return refuse(ctx, 503, f"The database cannot be reached just now: {exc}")
    return refuse(ctx, 503, f"leaseq could not do that: {exc}")


Endpoint = Callable[[Request], Awaitable[Response]]


async def _checks(
    request: Request, ctx: Context, permission: str, *, post: bool, login: bool
) -> Response | None:
    """The refusal a request gets before its handler runs (and ``ctx.principal``
    set), or None: not signed in (401), cross-site or without the form's token (403),
    not permitted (403)."""
    dashboard = ctx.dashboard
    if not login:
        principal = await dashboard.principal(request)
        if principal is None:
            return _unauthenticated(ctx)
        ctx.principal = principal
    if post:
        reason = security.cross_site_reason(request)
        if reason is None:
            form = await request.form()
            token = form.get("csrf")
            if not dashboard.csrf.valid(
                request.cookies.get(security.SESSION_COOKIE),
                token if isinstance(token, str) else None,
            ):
                reason = "the form's security token is missing or expired: reload the page"
        if reason is not None:
            return refuse(ctx, 403, f"Refused: {reason}.")
    if not login and not ctx.principal.can(permission):
        why = "the dashboard is read-only" if dashboard.read_only else "you may not"
        return refuse(ctx, 403, f"Refused: {why} ({permission}).")
    return None


def handler(
    permission: str = security.READ, *, post: bool = False, login: bool = False
) -> Callable[[Handler], Endpoint]:
    """Wrap a page or action: authenticate (401), refuse cross-site requests and
    missing CSRF tokens on POST (403), check ``permission`` (403), and show
    leaseq's errors as pages. ``login``: the login form itself (no auth)."""

    def wrap(function: Handler) -> Endpoint:
        async def endpoint(request: Request) -> Response:
            dashboard: Dashboard = request.app.state.leaseq
            # Built first, from nothing it can fail on (a cookie it cannot read is
            # ignored): whatever fails afterwards is a page of ours, with our headers.
            ctx = Context(request, dashboard, None)
            try:
                refused = await _checks(request, ctx, permission, post=post, login=login)
                return refused or await function(request, ctx)
            except leaseq.LeaseqError as exc:
                log.info("dashboard request failed: %s", exc)
                return error_page(ctx, exc)
            except HTTPException as exc:  # Starlette's own: a form body it cannot parse
                return refuse(ctx, exc.status_code, exc.detail)
            except Exception:
                # Our own page (with its headers), not a bare traceback: the details
                # go to the log, which leaseq's errors already reach scrubbed.
                log.exception("dashboard request %s %s failed", request.method, request.url.path)
                return refuse(ctx, 500, "Something went wrong on the dashboard's side.")

        endpoint.__name__ = function.__name__
        return endpoint

    return wrap
