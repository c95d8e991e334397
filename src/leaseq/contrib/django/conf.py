"""``settings.LEASEQ``: where leaseq's schema is and how the worker command runs.

Every key is optional::

    LEASEQ = {
        "DATABASE": "default",    # the alias enqueue() and job_atomic() write through
        "DATABASE_URL": None,     # leaseq's own connections; else built from DATABASES
        "SCHEMA": "leaseq",       # the schema of leaseq's tables
        "APP": None,              # "module:app", a leaseq.App with handlers of your own
        "CONCURRENCY": 10,        # leaseq_worker's default --concurrency
        "MIGRATE": True,          # manage.py migrate also runs leaseq's migrations
    }
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.db import connections
from psycopg.conninfo import make_conninfo

DEFAULTS: dict[str, Any] = {
    "DATABASE": "default",
    "DATABASE_URL": None,
    "SCHEMA": "leaseq",
    "APP": None,
    "CONCURRENCY": 10,
    "MIGRATE": True,
}

#: Keys of a DATABASES entry's OPTIONS that are Django's own, not libpq's.
DJANGO_OPTIONS = frozenset(
    {
        "assume_role",
        "client_encoding",
        "context",
        "cursor_factory",
        "isolation_level",
        "pool",
        "prepare_threshold",
        "server_side_binding",
    }
)


@dataclass(frozen=True, slots=True)
class LeaseqSettings:
    """``settings.LEASEQ`` merged over the defaults."""

    database: str
    database_url: str | None
    schema: str
    app: str | None
    concurrency: int
    migrate: bool

    def dsn(self, alias: str | None = None) -> str:
        """The URL leaseq's own connections use: DATABASE_URL, else a libpq
        connection string built from the alias' entry of DATABASES."""
        if self.database_url:
            return self.database_url
        return dsn_of(alias or self.database)


def leaseq_settings() -> LeaseqSettings:
    """Read ``settings.LEASEQ`` (ImproperlyConfigured for an unknown key or a bad value)."""
    given = getattr(settings, "LEASEQ", None) or {}
    if not isinstance(given, dict):
        raise ImproperlyConfigured("settings.LEASEQ must be a dict")
    unknown = set(given) - set(DEFAULTS)
    if unknown:
        raise ImproperlyConfigured(
            f"settings.LEASEQ: unknown keys {sorted(unknown)} (known: {sorted(DEFAULTS)})"
        )
    merged = {**DEFAULTS, **given}
    if merged["DATABASE"] not in settings.DATABASES:
        raise ImproperlyConfigured(
            f"settings.LEASEQ['DATABASE'] is {merged['DATABASE']!r}, not an alias of DATABASES"
        )
    concurrency = merged["CONCURRENCY"]
    if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
        raise ImproperlyConfigured("settings.LEASEQ['CONCURRENCY'] must be a positive integer")
    return LeaseqSettings(
        database=merged["DATABASE"],
        database_url=merged["DATABASE_URL"],
        schema=merged["SCHEMA"],
        app=merged["APP"],
        concurrency=concurrency,
        migrate=bool(merged["MIGRATE"]),
    )


def dsn_of(alias: str) -> str:
    """A libpq connection string to the database of ``DATABASES[alias]`` (as Django
    connects to it now: in Django's test runner, the test database)."""
    entry: dict[str, Any] = connections[alias].settings_dict
    engine = str(entry.get("ENGINE", ""))
    if "postgresql" not in engine and "postgis" not in engine:
        raise ImproperlyConfigured(
            f"DATABASES[{alias!r}] is not PostgreSQL ({engine}): leaseq needs PostgreSQL"
        )
    params: dict[str, Any] = {
        key: value
        for key, value in (entry.get("OPTIONS") or {}).items()
        if key not in DJANGO_OPTIONS and isinstance(value, str | int | float)
    }
    for key, setting in (
        ("dbname", "NAME"),
        ("user", "USER"),
        ("password", "PASSWORD"),
        ("host", "HOST"),
        ("port", "PORT"),
    ):
        value = entry.get(setting)
        if value not in (None, ""):
            params[key] = str(value)
    if "dbname" not in params and "service" not in params:
        params["dbname"] = "postgres"  # NAME None: Django's own choice
    return make_conninfo("", **params)
