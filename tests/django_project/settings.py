"""The test project's settings, from the environment when it names a database (for
``python -m django ...`` in a subprocess); in-process, the tests pass
:func:`configuration` to ``settings.configure``.

* ``LEASEQ_TEST_DATABASE_URL``: the test database;
* ``LEASEQ_TEST_APP_SCHEMA``: the search_path of Django's own connections (its tables);
* ``LEASEQ_TEST_SCHEMA``: leaseq's schema (``settings.LEASEQ["SCHEMA"]``).
"""

from __future__ import annotations

import os
from typing import Any

from psycopg.conninfo import conninfo_to_dict


def configuration(database_url: str, app_schema: str, leaseq_schema: str) -> dict[str, Any]:
    params = conninfo_to_dict(database_url)
    return {
        "SECRET_KEY": "tests-only",
        "USE_TZ": True,
        "DEFAULT_AUTO_FIELD": "django.db.models.BigAutoField",
        "INSTALLED_APPS": ["leaseq.contrib.django", "tests.django_project.shop"],
        "DATABASES": {
            "default": {
                "ENGINE": "django.db.backends.postgresql",
                "NAME": params.get("dbname") or "postgres",
                "USER": params.get("user", ""),
                "PASSWORD": params.get("password", ""),
                "HOST": params.get("host", ""),
                "PORT": params.get("port", ""),
                "OPTIONS": {"options": f"-c search_path={app_schema}"},
            }
        },
        # No DATABASE_URL: leaseq's own connections are built from DATABASES.
        "LEASEQ": {"SCHEMA": leaseq_schema},
        "TASKS": {
            "default": {
                "BACKEND": "leaseq.contrib.django.tasks.LeaseqBackend",
                "QUEUES": ["default", "emails"],
                "OPTIONS": {"MAX_ATTEMPTS": 1},
            }
        },
    }


if "LEASEQ_TEST_DATABASE_URL" in os.environ:
    globals().update(
        configuration(
            os.environ["LEASEQ_TEST_DATABASE_URL"],
            os.environ["LEASEQ_TEST_APP_SCHEMA"],
            os.environ["LEASEQ_TEST_SCHEMA"],
        )
    )
