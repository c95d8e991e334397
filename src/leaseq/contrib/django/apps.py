"""The Django app: ``INSTALLED_APPS = [..., "leaseq.contrib.django"]`` (label ``leaseq``)."""

from __future__ import annotations

from typing import Any

from django.apps import AppConfig
from django.db.models.signals import post_migrate


class LeaseqConfig(AppConfig):  # type: ignore[misc]  # Django has no inline types
    name = "leaseq.contrib.django"
    label = "leaseq"
    verbose_name = "leaseq"

    def ready(self) -> None:
        post_migrate.connect(migrate_leaseq, sender=self, dispatch_uid="leaseq.migrate")


def migrate_leaseq(*, using: str, verbosity: int = 1, **kwargs: Any) -> None:
    """After ``manage.py migrate`` of ``LEASEQ["DATABASE"]``: leaseq's own migrations
    (idempotent, serialised by an advisory lock), unless ``LEASEQ["MIGRATE"]`` is
    False. On the database Django migrated (in the test runner, the test database),
    unless ``LEASEQ["DATABASE_URL"]`` names another."""
    from leaseq import Queue  # noqa: PLC0415

    from .conf import leaseq_settings  # noqa: PLC0415

    config = leaseq_settings()
    if not config.migrate or using != config.database:
        return
    with Queue(config.dsn(using), schema=config.schema, pool_size=1) as queue:
        applied = queue.migrate()
    if applied and verbosity >= 1:
        print(f"  leaseq: applied migrations {applied} to schema {config.schema}")
