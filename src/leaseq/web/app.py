"""``create_app``: the dashboard as a Starlette app, its client and its routes."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import jinja2
from starlette.applications import Starlette
from starlette.convertors import Convertor, register_url_convertor
from starlette.middleware import Middleware
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Receive, Scope, Send

import leaseq

from .._secret_fields import SECRET_FIELDS, SecretMask
from . import actions, pages, views
from .context import Dashboard
from .data import Aggregates, SharedCache
from .security import Auth, Csrf, SecurityHeaders, TrustedHosts

HERE = Path(__file__).resolve().parent
#: Connections of the dashboard's own pool: pages run a few statements each, and
#: the shared cache keeps many tabs from multiplying them.
POOL_SIZE = 3
#: The most ids ``replay_many`` takes in one call (a bulk replay is one call), and
#: the largest window ``find_jobs`` searches: beyond them every use would fail.
MAX_BULK_LIMIT = 10_000
MAX_SEARCH_WINDOW = 10_000_000


class JobIdConvertor(Convertor[int]):
    """A job id in a path: at most 19 ASCII digits (bigints have 19). Starlette's
    ``int`` convertor calls ``int()`` on digits of any length while routing, outside
    every handler, and ``int()`` refuses more than 4,300: a bare 500. A longer
    path matches no route (404); a 19-digit number past the bigint range is the
    handler's to refuse."""

    regex = "[0-9]{1,19}"

    def convert(self, value: str) -> int:
        return int(value)

    def to_string(self, value: int) -> str:
        return str(value)


# Under a name of ours: Starlette's convertors are one registry per process.
register_url_convertor("leaseq_job_id", JobIdConvertor())


class _Dashboard(Starlette):
    """Starlette with :class:`SecurityHeaders` outside everything, its
    ``ServerErrorMiddleware`` too: the 500 of an error outside our handlers carries
    the headers as well."""

    def build_middleware_stack(self) -> ASGIApp:
        return SecurityHeaders(super().build_middleware_stack())


def _client(
    queue: leaseq.AsyncQueue | leaseq.Queue | str | None, schema: str, statement_timeout: float
) -> leaseq.AsyncQueue:
    """The dashboard's own client: given a queue, one on its database and schema (so
    that our statement timeout and pool leave the application's alone)."""
    if isinstance(queue, leaseq.AsyncQueue | leaseq.Queue):
        dsn: str | None = queue.dsn
        schema = queue.schema
    else:
        dsn = queue
    return leaseq.AsyncQueue(
        dsn,
        schema=schema,
        statement_timeout=statement_timeout,
        pool_size=POOL_SIZE,
        connect_timeout=10.0,
        metrics=None,
    )


def _templates() -> jinja2.Environment:
    environment = jinja2.Environment(
        loader=jinja2.FileSystemLoader(HERE / "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    environment.filters.update(views.FILTERS)
    return environment


def create_app(
    queue: leaseq.AsyncQueue | str | None = None,
    *,
    schema: str = "leaseq",
    read_only: bool = False,
    auth: Auth | None = None,
    secret_fields: Iterable[str] = SECRET_FIELDS,
    cache_seconds: float = 2.0,
    search_window: int = 10_000,
    statement_timeout: float = 5.0,
    bulk_limit: int = 1000,
    title: str = "leaseq",
    secret: bytes | None = None,
    allowed_hosts: Iterable[str] | None = None,
) -> Starlette:
    """The leaseq dashboard as an ASGI app.

    ``queue``: an ``AsyncQueue`` (the dashboard makes a sibling client on its
    database and schema), a DSN, or None (leaseq's default database). ``auth``:
    ``Request -> Principal | None`` (sync or async) for apps that mount it behind
    their own sign-in; without it everyone gets every permission (``read_only``:
    only ``read``). ``secret``: the key of the CSRF tokens, the same in every
    process serving the app (default: random, fine for one process).
    ``allowed_hosts``: the only ``Host`` names answered (None: any); ``leaseq
    dashboard`` without auth answers to loopback names only (DNS rebinding)."""
    if bulk_limit < 1 or search_window < 1 or cache_seconds < 0 or statement_timeout <= 0:
        raise leaseq.InvalidArgument(
            "bulk_limit and search_window must be positive, cache_seconds >= 0, "
            "statement_timeout > 0"
        )
    if bulk_limit > MAX_BULK_LIMIT:
        raise leaseq.InvalidArgument(f"bulk_limit must be at most {MAX_BULK_LIMIT:,}")
    if search_window > MAX_SEARCH_WINDOW:
        raise leaseq.InvalidArgument(f"search_window must be at most {MAX_SEARCH_WINDOW:,}")
    if isinstance(allowed_hosts, str):
        raise leaseq.InvalidArgument("allowed_hosts must be a list of host names, not one string")
    client = _client(queue, schema, statement_timeout)
    dashboard = Dashboard(
        client=client,
        aggregates=Aggregates(client, SharedCache(cache_seconds)),
        csrf=Csrf(secret),
        auth=auth,
        read_only=read_only,
        mask=SecretMask(secret_fields),
        search_window=search_window,
        bulk_limit=bulk_limit,
        title=title,
        templates=_templates(),
    )

    @asynccontextmanager
    async def lifespan(_: Starlette) -> AsyncIterator[None]:
        # The pool opens on the first page; it closes with the app.
        yield
        await client.close()

    app = _Dashboard(
        routes=_routes(),
        middleware=[Middleware(TrustedHosts, allowed_hosts)] if allowed_hosts is not None else [],
        lifespan=lifespan,
    )
    app.state.leaseq = dashboard
    return app


def _routes() -> list[Any]:
    return [
        Route("/", pages.overview, name="overview"),
        Route("/live/overview", pages.overview_live),
        Route("/jobs", pages.jobs, name="jobs"),
        Route("/jobs/{job_id:leaseq_job_id}", pages.job, name="job"),
        Route("/jobs/{job_id:leaseq_job_id}/live", pages.job_live),
        Route("/jobs/{job_id:leaseq_job_id}/replay", actions.replay, methods=["POST"]),
        Route("/jobs/{job_id:leaseq_job_id}/cancel", actions.cancel, methods=["POST"]),
        Route("/jobs/{job_id:leaseq_job_id}/skip", actions.skip, methods=["POST"]),
        Route("/replay", actions.replay_matching, methods=["POST"]),
        Route("/replay/confirm", actions.replay_confirmed, methods=["POST"]),
        Route("/failed", pages.failed, name="failed"),
        Route("/blocked", pages.blocked, name="blocked"),
        Route("/running", pages.running, name="running"),
        Route("/live/running", pages.running_live),
        Route("/audit", pages.audit, name="audit"),
        Route("/schedules", pages.schedules, name="schedules"),
        Route("/schedules/remove", actions.remove_schedule, methods=["POST"]),
        Route("/queues/{name}", pages.queue_settings, name="queue"),
        Route("/queues/{name}/settings", actions.configure, methods=["POST"]),
        Route("/queues/{name}/pause", actions.pause, methods=["POST"]),
        Route("/queues/{name}/resume", actions.resume, methods=["POST"]),
        Route("/login", pages.login_form, methods=["GET"]),
        Route("/login", actions.login, methods=["POST"]),
        Route("/logout", actions.logout, methods=["POST"]),
        Mount("/static", StaticFiles(directory=HERE / "static"), name="static"),
    ]


def served_under(app: ASGIApp, prefix: str) -> ASGIApp:
    """``app`` served by a reverse proxy at ``prefix`` ("/queues"; "" for none):
    its links, forms and cookies are written under the prefix (the scope's
    ``root_path``), whether the proxy strips the prefix from the paths it
    forwards or keeps it. (uvicorn's own ``root_path`` takes only the first.)"""
    if not prefix:
        return app

    async def under_prefix(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] in ("http", "websocket"):
            path: str = scope["path"]
            if path == prefix or path.startswith(f"{prefix}/"):
                path = path[len(prefix) :]
            scope = {**scope, "root_path": prefix, "path": f"{prefix}{path or '/'}"}
        await app(scope, receive, send)

    return under_prefix
