"""The demo application's own SQL, kept in .sql files like leaseq's."""

from __future__ import annotations

from functools import cache
from importlib import resources
from typing import Any

from leaseq.statement import Operation, Rows, Statement

from . import SCHEMA


@cache
def text(file: str) -> str:
    source = resources.files("leaseq.demo").joinpath("sql", f"{file}.sql").read_text("utf-8")
    return source.replace("{schema}", f'"{SCHEMA}"')


def statement(file: str, **params: Any) -> Statement:
    return Statement(text(file), params)


def query(file: str, **params: Any) -> Operation[Rows]:
    """One statement whose rows come back as they are."""
    return Operation((statement(file, **params),), lambda rows: rows[0])
