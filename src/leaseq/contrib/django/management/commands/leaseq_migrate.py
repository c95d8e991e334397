"""``manage.py leaseq_migrate``: create or upgrade leaseq's schema."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand

from leaseq.contrib.django import queue


class Command(BaseCommand):  # type: ignore[misc]  # Django has no inline types
    help = "Create or upgrade leaseq's schema (settings.LEASEQ); safe to run concurrently."

    def handle(self, *args: Any, **options: Any) -> None:
        jobs = queue()
        applied = jobs.migrate()
        if applied:
            self.stdout.write(f"applied migrations {applied} to schema {jobs.schema}")
        else:
            self.stdout.write(f"schema {jobs.schema} is up to date")
