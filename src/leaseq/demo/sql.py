"""The demo application's own SQL, kept in .sql files like leaseq's, run on
connections of the queue's pool (``Queue.connection()``) or inside a job's
transaction (``job.transaction()``): the public API, nothing of leaseq's inside."""

from __future__ import annotations

from functools import cache
from importlib import resources
from typing import Any

import psycopg

from . import SCHEMA

Rows = list[tuple[Any, ...]]


@cache
def text(file: str) -> str:
    source = resources.files("leaseq.demo").joinpath("sql", f"{file}.sql").read_text("utf-8")
    return source.replace("{schema}", f'"{SCHEMA}"')


def fetch(conn: psycopg.Connection[Any], file: str, **params: Any) -> Rows:
    """Run one of the demo's statements; its rows ([] for a statement without)."""
    cursor = conn.execute(text(file), params or None)
    return cursor.fetchall() if cursor.description is not None else []


async def afetch(conn: psycopg.AsyncConnection[Any], file: str, **params: Any) -> Rows:
    """The async twin of :func:`fetch`."""
    cursor = await conn.execute(text(file), params or None)
    return await cursor.fetchall() if cursor.description is not None else []
