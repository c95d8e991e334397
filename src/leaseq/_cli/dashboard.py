"""``leaseq dashboard``: the web dashboard (``leaseq.web``) served by uvicorn.

Bound to a loopback address it needs no auth (whoever can reach it is on this
machine), and answers only to loopback names in ``Host``: a page of another site
that points its own name at 127.0.0.1 (DNS rebinding) gets a 400. Bound anywhere
else it refuses to start unless the environment configures auth:
``LEASEQ_DASHBOARD_TOKEN`` (a bearer token; browsers sign in once with it) or
``LEASEQ_DASHBOARD_USER`` + ``LEASEQ_DASHBOARD_PASSWORD`` (HTTP basic). Secrets
come from the environment, never from options, so that they do not show in
``ps`` or shell history.
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Mapping
from typing import Any

import click

from leaseq import InvalidArgument

from .common import CommandError, bound_socket, cli, database_options

TOKEN_VARIABLE = "LEASEQ_DASHBOARD_TOKEN"
USER_VARIABLE = "LEASEQ_DASHBOARD_USER"
PASSWORD_VARIABLE = "LEASEQ_DASHBOARD_PASSWORD"
#: The names a browser on this machine reaches a loopback dashboard by.
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")


def is_loopback(host: str) -> bool:
    """127.0.0.0/8, ::1 and ``localhost``: reachable from this machine only."""
    if host.strip().lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a host name: it may resolve to anything


def auth_from_environment(host: str, environ: Mapping[str, str]) -> Any:
    """The ``auth`` callable the environment configures (None: none), or a
    CommandError when ``host`` is not loopback and there is none, or when the
    variables are half set."""
    from leaseq.web import BasicAuth, TokenAuth  # noqa: PLC0415 - the optional web extra

    token = environ.get(TOKEN_VARIABLE, "")
    user = environ.get(USER_VARIABLE, "")
    password = environ.get(PASSWORD_VARIABLE, "")
    if token:
        try:
            return TokenAuth(token)
        except ValueError as exc:
            # Not "NAME: reason": that is the shape of a secret, and the scrubbing
            # of everything the CLI prints would leave "LEASEQ_DASHBOARD_TOKEN: ***".
            raise CommandError(f"{TOKEN_VARIABLE} is refused: {exc}") from None
    if user or password:
        if not (user and password):
            raise CommandError(f"set both {USER_VARIABLE} and {PASSWORD_VARIABLE}")
        return BasicAuth(user, password)
    if not is_loopback(host):
        raise CommandError(
            f"refusing to serve the dashboard on {host} without auth: set {TOKEN_VARIABLE}, "
            f"or {USER_VARIABLE} and {PASSWORD_VARIABLE} (or bind --host 127.0.0.1)"
        )
    return None


@cli.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", type=click.IntRange(0, 65535), default=8080, show_default=True)
@click.option("--read-only", is_flag=True, help="Look only: every action is refused.")
@click.option(
    "--root-path",
    default="",
    metavar="PREFIX",
    callback=lambda _ctx, _param, value: checked_root_path(value),
    help="The path a reverse proxy serves it under (/queues): its links, forms and "
    "cookies stay below it, whether the proxy strips the prefix or forwards it.",
)
@database_options
def dashboard(  # (click passes every option by name)
    *, host: str, port: int, read_only: bool, root_path: str, database_url: str | None, schema: str
) -> None:
    """Serve the web dashboard (needs the web extra). Off loopback it needs
    $LEASEQ_DASHBOARD_TOKEN or $LEASEQ_DASHBOARD_USER + $LEASEQ_DASHBOARD_PASSWORD."""
    try:
        import uvicorn  # noqa: PLC0415 - the optional web extra

        from leaseq.web import create_app  # noqa: PLC0415
        from leaseq.web.app import served_under  # noqa: PLC0415
    except ImportError as exc:
        raise InvalidArgument(
            f"the dashboard needs its extra: pip install 'leaseq[web]' ({exc.name} is missing)"
        ) from exc
    auth = auth_from_environment(host, os.environ)
    app = create_app(
        database_url,
        schema=schema,
        read_only=read_only,
        auth=auth,
        # Without auth, whoever can reach it is on this machine, and a page of
        # another site must not reach it under its own name (DNS rebinding).
        allowed_hosts=(*LOOPBACK_NAMES, host) if auth is None else None,
    )
    # Bound here, before the banner: it shows the port really served (with --port
    # 0 too), and a port taken is the command's one-line error, not a banner
    # followed by uvicorn's "[Errno 98]".
    with bound_socket(host, port, "--port") as sock:
        sock.listen(2048)  # uvicorn's backlog
        shown = f"[{host}]" if ":" in host else host
        mode = " (read-only)" if read_only else ""
        how = "no auth: loopback only" if auth is None else type(auth).__name__
        if root_path:
            how += f"; under {root_path}"
        served = f"http://{shown}:{sock.getsockname()[1]}/"
        click.echo(f"leaseq dashboard{mode} on {served} ({how}); Ctrl-C stops it")
        served_app = served_under(app, root_path)
        uvicorn.run(served_app, fd=sock.fileno(), log_level="warning", server_header=False)


def checked_root_path(value: str) -> str:
    """``--root-path`` as the ASGI scope takes it: "" or "/a/b" (no trailing
    slash); anything a URL path would not carry as written is refused."""
    prefix = value.strip().rstrip("/")
    if not prefix:
        return ""
    if (
        not prefix.startswith("/")
        or any(c in prefix for c in "?#\\\"<>'` " + "".join(map(chr, range(32))))
        or "//" in prefix
        or "/../" in f"{prefix}/"
        or "/./" in f"{prefix}/"
    ):
        raise click.BadParameter(f"a URL path like /queues, got {value!r}")
    return prefix
