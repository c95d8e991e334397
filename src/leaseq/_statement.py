"""Statements, operations and steps: what the store builds and the db module runs.

Nothing here does I/O. An :class:`Operation` is statements plus a decoder;
:data:`Steps` is a generator of operations whose next one may depend on the
answer to the last (a claim that finds repair notes due, a replay in batches):
the sync and the async client drive the same steps, so their logic is written
once. A :data:`Plan` yields bare statements run in one transaction (migrations).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Generator, Mapping
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from typing import Any, Generic, TypeVar

T = TypeVar("T")
Rows = list[tuple[Any, ...]]


@dataclass(frozen=True, slots=True)
class Statement:
    sql: str
    params: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Operation(Generic[T]):
    """Statements run in one transaction (or in the caller's), then decoded.

    ``decode`` gets the rows of every statement, in order.
    """

    statements: tuple[Statement, ...]
    decode: Callable[[list[Rows]], T]
    #: SQLSTATEs after which the operation is simply sent again (on leaseq's own
    #: connection only, never inside a caller's transaction): a claim that lost
    #: a race on job_running_key_idx (23505) finds the key taken and moves on.
    retry_on: frozenset[str] = frozenset()
    #: Runs on leaseq's own connection and commits at once, even when the steps
    #: it belongs to run in a caller's transaction.
    detached: bool = False
    #: What gives back the effect of the operation, given its result, when it
    #: committed on leaseq's own connection but its caller was interrupted (a task
    #: cancelled, Ctrl-C) before it saw the result: a claim's jobs would otherwise
    #: stay running, unseen by anyone, until their leases end. None: nothing to undo.
    undo: Callable[[T], Operation[Any] | None] | None = None

    @property
    def single(self) -> bool:
        return len(self.statements) == 1


#: Operations, each sent once the previous one's result is in; returns the result.
Steps = Generator[Operation[Any], Any, T]

#: Statements run in one transaction, each receiving the rows of the last (migrations).
Plan = Generator[Statement, Rows, list[int]]


@cache
def sql_text(name: str) -> str:
    """A shipped statement, without its comments (see :func:`compact`), with each
    ``{fragment:NAME}`` in it replaced by ``sql/fragments/NAME.sql``: a clause
    several statements share is written once."""
    path = resources.files("leaseq").joinpath("sql", *name.split("/"))
    text = compact(path.read_text(encoding="utf-8"))
    return _FRAGMENT.sub(lambda use: sql_text(f"fragments/{use[1]}.sql"), text)


#: Where a statement takes in a shared clause (a fragment holds none itself).
_FRAGMENT = re.compile(r"\{fragment:([a-z_]+)\}")


def compact(sql: str) -> str:
    """``sql`` without ``--`` comments, blank lines and indentation.

    The statements' files explain themselves at length; the driver caches the
    conversion of a query only up to 4,096 characters (psycopg's
    MAX_CACHED_STATEMENT_LENGTH), and the claim, 5.5 kB with its comments, was
    parsed again on every call. Quoted text (strings, identifiers, dollar
    quotes) is kept as written, a ``--`` inside it included.
    """
    kept: list[str] = []
    i, n = 0, len(sql)
    plain = 0  # where the unquoted text being read began
    while i < n:
        char = sql[i]
        if sql.startswith("--", i):
            _keep_plain(kept, sql[plain:i].rstrip(" \t"))
            end = sql.find("\n", i)
            i = plain = n if end < 0 else end
            continue
        if char in "'\"":
            end = sql.find(char, i + 1)
            while end >= 0 and sql.startswith(char, end + 1):  # '' and "" escape
                end = sql.find(char, end + 2)
            end = n if end < 0 else end + 1
        elif char == "$" and (tag := _dollar_tag(sql, i)):
            close = sql.find(tag, i + len(tag))
            end = n if close < 0 else close + len(tag)
        else:
            i += 1
            continue
        _keep_plain(kept, sql[plain:i])
        kept.append(sql[i:end])  # quoted: as written
        i = plain = end
    _keep_plain(kept, sql[plain:])
    return "".join(kept).strip()


def _keep_plain(kept: list[str], text: str) -> None:
    """Unquoted text, kept without indentation, trailing blanks and empty lines
    (one left where a comment was cut out included)."""
    text = re.sub(r"[ \t]*\n\s*", "\n", text)
    if text.startswith("\n") and kept and kept[-1].endswith("\n"):
        text = text[1:]
    kept.append(text)


def _dollar_tag(sql: str, at: int) -> str:
    """The dollar-quote tag opening at ``at`` (``$$``, ``$body$``), else ""."""
    end = at + 1
    while end < len(sql) and (sql[end].isalnum() or sql[end] == "_"):
        end += 1
    opens = end < len(sql) and sql[end] == "$" and not sql[at + 1 : end][:1].isdigit()
    return sql[at : end + 1] if opens else ""


def migration_files() -> list[tuple[int, str, str]]:
    """(version, name, text) of every shipped migration, in order."""
    folder = resources.files("leaseq").joinpath("sql", "migrations")
    found = []
    for entry in folder.iterdir():
        if entry.name.endswith(".sql"):
            version = int(entry.name.split("_", 1)[0])
            found.append((version, entry.name.removesuffix(".sql"), entry.read_text("utf-8")))
    return sorted(found)


def notify_channel(schema: str, topic: str = "") -> str:
    """A channel name unique per schema (and topic: "" for enqueues, "results" for
    finished jobs) within PostgreSQL's 63-byte identifier limit. A topic's names
    hold a dot, which no schema name (nor so the work channel's) may: schema
    ``results_x``'s work channel is never schema ``x``'s results channel."""
    prefix = f"leaseq_{topic}." if topic else "leaseq_"
    name = f"{prefix}{schema}"
    if len(name) <= 63:
        return name
    digest = hashlib.sha256(schema.encode()).hexdigest()[:16]
    return f"{prefix}{schema[: 62 - len(prefix) - 17]}_{digest}"
