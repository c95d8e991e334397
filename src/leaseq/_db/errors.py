"""Driver errors as leaseq's typed errors: what ``_db`` raises instead of psycopg's.

Errors that say "try again later" become :class:`TransientError`; SQLSTATEs that
mean something to users their own types; any other error the server sent a
:class:`DatabaseError` with its SQLSTATE; every text scrubbed of secrets; a
query interrupted by its task's cancellation the task's cancellation.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager, suppress

import psycopg
from psycopg.conninfo import conninfo_to_dict
from psycopg_pool import PoolTimeout

from .._errors import (
    BacklogFull,
    DatabaseError,
    DatabaseUnavailable,
    InvalidArgument,
    InvalidDatabaseURL,
    NotMigrated,
    PayloadTooLarge,
    StatementTimeout,
    TransientError,
    UniqueKeyHeld,
)
from .._redact import redact
from .._validate import sanitize
from .._waiting import raise_if_cancelling

_ERRORS_BY_SQLSTATE: dict[str, type[Exception]] = {
    "57014": StatementTimeout,  # query_canceled: statement_timeout (or pg_cancel_backend)
    "LQ001": BacklogFull,
    "LQ002": PayloadTooLarge,
    "LQ003": UniqueKeyHeld,
    "3F000": NotMigrated,  # invalid_schema_name
    "42P01": NotMigrated,  # undefined_table
    "42883": NotMigrated,  # undefined_function
    "42703": NotMigrated,  # undefined_column (a schema older than the code: 0003's settings)
    "23514": InvalidArgument,  # check_violation
    "22003": InvalidArgument,  # numeric_value_out_of_range
    "22008": InvalidArgument,  # datetime_field_overflow
    # statement_too_complex: "stack depth limit exceeded", e.g. a payload nested
    # tens of thousands deep. An OperationalError, but sending it again fails again.
    "54001": InvalidArgument,
    # program_limit_exceeded: past one of PostgreSQL's sizes, e.g. "total size of
    # jsonb array elements exceeds the maximum" (a payload under the cap whose
    # numbers take more room as jsonb). Sending it again fails again.
    "54000": InvalidArgument,
    "22P02": InvalidArgument,  # invalid_text_representation
}

#: Names taken, during a migration: duplicate_table (or index), duplicate_object (a
#: type, a trigger), duplicate_function. leaseq's migrations never create what their
#: migration table says exists, so someone else's object holds the name.
_MIGRATION_CONFLICTS = frozenset({"42P07", "42710", "42723"})

#: A migration's lock wait given up: lock_not_available (its lock_timeout), or
#: deadlock_detected (the server chose it to end a deadlock with a worker's
#: transaction). Nothing of it was written; it may try again.
_MIGRATION_LOCK_WAITS = frozenset({"55P03", "40P01"})


class LockWaitOver(TransientError):
    """A migration gave up waiting for a lock (nothing of it was written): the
    client tries again (``_migrate.lock_waits``)."""


#: Plain words for the check constraints that input validation cannot see coming
#: (they compare a given setting with a stored one), by constraint name.
_CONSTRAINT_MESSAGES = {
    "queue_check": "backoff_cap must be >= backoff_base (the queue's stored value "
    "counts for the one not given)",
}


#: read_only_sql_transaction: a write (or a LISTEN on a standby) refused by a
#: read-only session.
READ_ONLY_SQLSTATE = "25006"


def read_only_server(error: BaseException) -> DatabaseUnavailable | None:
    """``error`` as what it means on a connection of leaseq's own, if the server
    refused it as read-only: the database cannot take writes now. leaseq never
    makes its own transactions read-only, so the server or the database is: a
    standby that a failover left the URL on, or ``default_transaction_read_only``
    set for a move. Trying again may reach a server that writes (a new
    connection: the refused one is not reused). None for any other error (the
    driver's, or leaseq's DatabaseError, which keeps the SQLSTATE)."""
    if getattr(error, "sqlstate", None) != READ_ONLY_SQLSTATE:
        return None
    cause = error.__cause__ if isinstance(error, DatabaseError) else error
    detail = cause.diag.message_primary if isinstance(cause, psycopg.Error) else None
    return DatabaseUnavailable(
        "the database is read-only now (a standby, or default_transaction_read_only "
        f"set): {redact(detail or str(error).strip())}; the next call connects again"
    )


@contextmanager
def translated_errors(*, migrating: bool = False) -> Iterator[None]:
    """Driver errors as leaseq's typed errors, every text scrubbed of secrets.

    OperationalError (a lost or refused connection, a deadlock, a serialization
    failure, a cancelled statement), a pool timeout and a socket error become
    TransientError; the SQLSTATEs of _ERRORS_BY_SQLSTATE their leaseq types;
    ``migrating``: a name already taken (_MIGRATION_CONFLICTS) InvalidArgument,
    a lock wait given up (_MIGRATION_LOCK_WAITS) LockWaitOver;
    any other error the server sent DatabaseError, which keeps its SQLSTATE.
    The driver's own errors (no SQLSTATE: a malformed DSN, a misuse) pass through.
    """
    try:
        yield
    except PoolTimeout as exc:  # a psycopg.Error too: caught first, for its own type
        raise DatabaseUnavailable(
            redact(f"cannot reach the database: no connection in time ({exc})")
        ) from exc
    except psycopg.Error as exc:
        _scrub(exc)
        raise_if_cancelling(exc)
        if migrating and exc.sqlstate in _MIGRATION_CONFLICTS:
            raise InvalidArgument(
                "cannot migrate: the schema holds objects leaseq's migrations did not make "
                f"({redact(exc.diag.message_primary or str(exc).strip())}); give leaseq a "
                "schema of its own"
            ) from exc
        if migrating and exc.sqlstate in _MIGRATION_LOCK_WAITS:
            raise LockWaitOver(redact(exc.diag.message_primary or str(exc).strip())) from exc
        if (refused := refused_for_good(exc)) is not None:  # a connection made outside a pool
            raise refused from exc
        kind = _ERRORS_BY_SQLSTATE.get(exc.sqlstate or "")
        if kind is None and isinstance(exc, psycopg.OperationalError):
            kind = TransientError
        if kind is None and exc.sqlstate is None:
            raise
        message = _CONSTRAINT_MESSAGES.get(exc.diag.constraint_name or "") or redact(
            exc.diag.message_primary or str(exc).strip() or type(exc).__name__
        )
        if kind is NotMigrated:
            message = f"{message} (has the leaseq schema been migrated? run `leaseq migrate`)"
        if kind is None:
            raise DatabaseError(
                f"{message} (SQLSTATE {exc.sqlstate})", sqlstate=exc.sqlstate
            ) from exc
        raise kind(message) from exc
    except OSError as exc:
        raise_if_cancelling(exc)
        raise TransientError(redact(f"{type(exc).__name__}: {exc}")) from exc
    except UnicodeEncodeError as exc:
        # Parameters go out as text in the connection's client_encoding: a caller's
        # connection in LATIN1, say, cannot carry every payload. Refused, typed.
        raise InvalidArgument(
            f"a value cannot be sent in the connection's client_encoding ({exc.encoding}): "
            f"{exc.reason} for {exc.object[exc.start : exc.end]!r}; use UTF8"
        ) from exc


def _scrub(error: BaseException) -> None:
    """Redact the texts of ``error`` and of the errors chained to it, in place:
    libpq may quote a DSN's password in them."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        with suppress(Exception):  # an odd exception must not hide the one being raised
            current.args = tuple(redact(a) if isinstance(a, str) else a for a in current.args)
        current = current.__cause__ or current.__context__


def unavailable(exc: psycopg.Error) -> DatabaseUnavailable:
    """A failed connection attempt as the error a caller gets."""
    if (refused := refused_for_good(exc)) is not None:
        return refused
    return DatabaseUnavailable(f"cannot connect to the database: {_reason(exc)}")


def malformed_dsn(dsn: str) -> InvalidDatabaseURL | None:
    """Why libpq cannot parse ``dsn``, or None. Asked before a pool tries it: the
    pool's attempts fail at once, but it retries them for seconds before the
    diagnosis attempt says why (every malformed URL took ~6 s to report)."""
    try:
        conninfo_to_dict(dsn)
    except psycopg.Error as exc:
        # The driver's own text may quote the password. So may what libpq quotes
        # of a URL it cannot parse, where redaction cannot find the password
        # (postgres:/user:secret@host): its quotes are left out.
        reason = re.sub(r'"([^"]*)"', lambda m: m[0] if len(m[1]) < 2 else '"…"', _reason(exc))
        return InvalidDatabaseURL(f"cannot connect to the database: invalid database URL: {reason}")
    return None


#: What libpq says when a connection is refused for a reason no retry can change:
#: the URL's credentials, role or database, an option's value, the server's rules
#: for this client (pg_hba.conf, SSL). libpq gives no SQLSTATE for a refused
#: connection, so its texts are read; a text not matched here (a server whose
#: lc_messages is not English) is retried as any other failed connection. A
#: server starting up, shutting down or full ("too many connections"), or a
#: standby where a writer was asked for, can change: those are not here.
_REFUSED_FOR_GOOD = re.compile(
    r"authentication failed for user"  # password, md5, scram, ident, peer, ldap, cert...
    r"|role \".*\" does not exist"
    r"|database \".*\" does not exist"
    r"|role \".*\" is not permitted to log in"
    r"|permission denied for database"
    r"|no pg_hba\.conf entry"
    r"|pg_hba\.conf rejects connection"
    r"|fe_sendauth: no password supplied"
    r"|server does not support SSL, but SSL was required"
    r"|invalid \w+ value"  # sslmode=bogus, target_session_attrs=..., checked before connecting
    r"|invalid port number"
    r"|invalid integer value"
    r"|unrecognized configuration parameter"  # the URL's options, or connection_options
    r"|invalid value for parameter"
    r"|unsupported startup parameter"  # PgBouncer, refusing the options leaseq sends
)


#: How psycopg lists the attempts of a URL with several hosts (or addresses), one
#: line each after this, each starting "- host: ".
_EACH_HOST = "\n- host: "


def refused_for_good(exc: BaseException) -> InvalidDatabaseURL | None:
    """``exc`` (a failed connection attempt) as an InvalidDatabaseURL if the server
    or libpq refused it for a reason that trying again cannot change, else None.
    With several hosts, only if every one refused so: one that is away (a primary
    restarting behind a failover URL) may answer next time."""
    if not isinstance(exc, psycopg.OperationalError) or exc.sqlstate is not None:
        return None
    text = str(exc)
    attempts = text.split(_EACH_HOST)[1:] or [text]
    if not all(_REFUSED_FOR_GOOD.search(attempt) for attempt in attempts):
        return None
    return InvalidDatabaseURL(f"cannot connect to the database: {_reason(exc)}")


def parsable(dsn: str) -> str:
    """``dsn``, or InvalidDatabaseURL: for a connection made outside the pools,
    where the driver would raise its raw error for it."""
    if (malformed := malformed_dsn(dsn)) is not None:
        raise malformed
    return dsn


def _reason(exc: psycopg.Error) -> str:
    """The driver error's first line, scrubbed (libpq may quote the DSN's password)."""
    reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return sanitize(reason)
