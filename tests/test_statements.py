"""The shipped statements are sent without their comments, and nothing else changes."""

from __future__ import annotations

import pytest

from leaseq._statement import compact, sql_text

#: psycopg caches the conversion of a query (placeholders to $n) only up to
#: this many characters (psycopg._queries.MAX_CACHED_STATEMENT_LENGTH).
DRIVER_CACHE_LIMIT = 4096


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


@pytest.mark.parametrize(
    "name",
    [
        *("claim.sql", "complete.sql", "renew.sql", "retry.sql", "fail.sql", "release.sql"),
        *("enqueue.sql", "enqueue_many.sql", "renew_one.sql", "reap.sql"),
    ],
)
def test_every_statement_of_a_jobs_life_fits_the_drivers_query_cache(name: str) -> None:
    text = sql_text(name)
    assert "--" not in text.replace("'--", "")
    assert len(text) < DRIVER_CACHE_LIMIT, (name, len(text))
