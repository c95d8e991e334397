"""Login roles for a test, with the grants the README's "Restricted roles" gives.

The grants are read from the README itself, so the documented SQL is what the
tests run: a grant missing from it fails a test, not a user in production.
Roles are the whole server's: each test makes its own, and drops them after.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg
from psycopg.conninfo import make_conninfo

README = Path(__file__).resolve().parent.parent / "README.md"


@dataclass(frozen=True)
class Roles:
    producer: str  # the producer role's URL
    worker: str  # the worker role's URL


def documented_grants() -> list[str]:
    """The statements of the SQL block under "### Restricted roles"."""
    section = README.read_text().split("### Restricted roles", 1)[1]
    block = section.split("```sql\n", 1)[1].split("```", 1)[0]
    return [statement.strip() for statement in block.split(";") if statement.strip()]


def _for(statement: str, schema: str, producer: str, worker: str) -> str:
    statement = re.sub(r"\bSCHEMA leaseq\b", f'SCHEMA "{schema}"', statement)
    statement = re.sub(r"\bleaseq\.", f'"{schema}".', statement)
    statement = re.sub(r"\bproducer\b", producer, statement)
    return re.sub(r"\bworker\b", worker, statement)


@contextlib.contextmanager
def restricted_roles(
    database_url: str, schema: str, *, leave_out: str | None = None
) -> Iterator[Roles]:
    """A producer and a worker role with the documented grants on ``schema``
    (but the statement containing ``leave_out``, if given: a missing grant)."""
    suffix = os.urandom(5).hex()
    producer, worker = f"t_producer_{suffix}", f"t_worker_{suffix}"
    statements = [s for s in documented_grants() if leave_out is None or leave_out not in s]
    with psycopg.connect(database_url, autocommit=True) as admin:
        for role in (producer, worker):
            admin.execute(f"CREATE ROLE {role} LOGIN")
        for statement in statements:
            admin.execute(_for(statement, schema, producer, worker))
    try:
        yield Roles(
            make_conninfo(database_url, user=producer), make_conninfo(database_url, user=worker)
        )
    finally:
        with psycopg.connect(database_url, autocommit=True) as admin:
            for role in (producer, worker):
                admin.execute(f"DROP OWNED BY {role}")
                admin.execute(f"DROP ROLE {role}")
