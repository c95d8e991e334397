"""leaseq's statements in the server's own placeholders (``$1``, ``$2``...),
converted once per text instead of once per call.

psycopg turns a query's ``%(name)s`` placeholders into ``$n`` on every
``execute``, and caches that conversion only for texts of up to 4,096
characters (its ``MAX_CACHED_STATEMENT_LENGTH``, meant to keep generated
``VALUES`` lists out of its cache). The claim is about 4,080 characters with
the default schema, and the schema's name appears in it 17 times: with any
name longer than seven characters, every claim's text went through psycopg's
splitting regular expression again (5 % of a worker's samples at
concurrency 50 in py-spy; bench/README.md has the drains before and after).

A statement whose placeholders are all ``%(name)s`` is sent through a raw
cursor in the form :func:`server_form` made once for its text. Nothing else
changes on the wire: ``%s`` is psycopg's AUTO format, the one a raw cursor gives
every parameter, and each name is bound to one ``$n`` as psycopg binds it.
A text with any other placeholder (``%(name)b``: the fenced batches send their
arrays in binary) keeps psycopg's own conversion.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

# psycopg's escapes and placeholders: "%%" is a "%", "%(name)s" a parameter; any
# other "%" (a positional "%s", a "%(name)b") makes the text psycopg's to convert.
_PERCENT = re.compile(r"%(?:(%)|\((\w+)\)s)?")


@dataclass(frozen=True, slots=True)
class ServerForm:
    """A statement's text with ``$n`` placeholders, and the parameter each one takes."""

    sql: str
    names: tuple[str, ...]

    def values(self, params: Mapping[str, Any]) -> tuple[Any, ...]:
        return tuple([params[name] for name in self.names])


@lru_cache(maxsize=512)  # leaseq's statement texts: a few dozen, per schema
def server_form(sql: str) -> ServerForm | None:
    """``sql`` with ``$n`` placeholders, or None when psycopg must convert it."""
    chunks: list[str] = []
    numbers: dict[str, int] = {}
    last = 0
    for match in _PERCENT.finditer(sql):
        escaped, name = match.groups()
        if escaped is None and name is None:
            return None
        chunks.append(sql[last : match.start()])
        if escaped is not None:
            chunks.append("%")
        else:
            chunks.append(f"${numbers.setdefault(name, len(numbers) + 1)}")
        last = match.end()
    if not numbers:
        return None  # nothing to bind: psycopg sends it as it is
    chunks.append(sql[last:])
    return ServerForm("".join(chunks), tuple(numbers))
