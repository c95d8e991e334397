"""The shipped statements are sent without their comments, and nothing else changes."""

from __future__ import annotations

from importlib import resources

import pytest
from psycopg._queries import (  # the driver's own conversion, as the oracle
    PostgresQuery,
    PostgresRawQuery,
)
from psycopg.adapt import Transformer

from leaseq._db.placeholders import server_form
from leaseq._statement import compact
from leaseq._store.base import StoreBase

#: psycopg caches the conversion of a query (placeholders to $n) only up to
#: this many characters (psycopg._queries.MAX_CACHED_STATEMENT_LENGTH).
DRIVER_CACHE_LIMIT = 4096

#: The longest name PostgreSQL keeps for a schema (NAMEDATALEN - 1 bytes).
LONGEST_SCHEMA = "s" * 63

SHIPPED = sorted(
    entry.name
    for entry in resources.files("leaseq").joinpath("sql").iterdir()
    if entry.name.endswith(".sql")
)


def test_comments_go_and_quoted_text_stays_as_written() -> None:
    sql = (
        "-- a header\n"
        "SELECT '--not a comment' AS a,  -- a comment\n"
        "       'it''s -- still text' AS b,\n"
        '       "odd--name" AS c,\n'
        "\n"
        "       $body$ -- kept\n  inside $body$ AS d, $1 -- gone\n"
    )
    assert compact(sql) == (
        "SELECT '--not a comment' AS a,\n"
        "'it''s -- still text' AS b,\n"
        '"odd--name" AS c,\n'
        "$body$ -- kept\n  inside $body$ AS d, $1"
    )


def test_an_unterminated_quote_is_kept_for_the_server_to_refuse() -> None:
    assert compact("SELECT 'open -- x") == "SELECT 'open -- x"


@pytest.mark.parametrize("name", SHIPPED)
def test_every_shipped_statement_is_converted_once_whatever_the_schemas_name(name: str) -> None:
    """psycopg converts a query's placeholders on every call unless the text fits its
    cache; with the schema's name in it 17 times the claim did not, for any name
    longer than seven characters. Each statement is sent in a form converted once
    (leaseq._db.placeholders), or, keeping psycopg's conversion (binary
    placeholders), fits the driver's cache even with the longest schema name."""
    text = StoreBase(LONGEST_SCHEMA).sql(name)
    assert "--" not in text.replace("'--", "")
    if "%(" in text and server_form(text) is None:
        assert len(text) <= DRIVER_CACHE_LIMIT, (name, len(text))


def test_the_server_form_binds_each_name_once_and_unescapes_percent_signs() -> None:
    form = server_form("SELECT %(a)s, %(b)s, %(a)s || '100%%', 'x' LIKE 'x%%'")
    assert form is not None
    assert form.sql == "SELECT $1, $2, $1 || '100%', 'x' LIKE 'x%'"
    assert form.values({"b": 2, "a": 1, "unused": 3}) == (1, 2)


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT %(ids)b::bigint[]",  # a binary placeholder: psycopg's to convert
        "SELECT %(a)s, %(ids)b::bigint[]",
        "SELECT %s",  # positional
        "SELECT %(odd name)s",
        "SELECT 1",  # nothing to bind
        "SELECT '100%%'",
    ],
)
def test_other_placeholders_are_left_to_psycopg(sql: str) -> None:
    assert server_form(sql) is None


@pytest.mark.parametrize("name", SHIPPED)
def test_each_shipped_statement_reaches_the_server_as_psycopg_would_send_it(name: str) -> None:
    """The oracle is psycopg's own conversion of the same text: the same $n text,
    and the same parameters, types and formats bound to each $n."""
    text = StoreBase("a_long_schema_name_for_the_claim").sql(name)
    form = server_form(text)
    if form is None:
        return
    params = {name: f"value {index}" for index, name in enumerate(form.names)}
    psycopgs = PostgresQuery(Transformer())
    psycopgs.convert(text, params)
    ours = PostgresRawQuery(Transformer())  # what a raw cursor sends
    ours.convert(form.sql, form.values(params))
    assert ours.query == psycopgs.query
    assert (ours.params, ours.types, ours.formats) == (
        psycopgs.params,
        psycopgs.types,
        psycopgs.formats,
    )
