"""``manage.py leaseq_worker``: run leaseq's worker with Django set up."""

from __future__ import annotations

import asyncio
import os
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import connections

from leaseq import InvalidArgument, Worker
from leaseq.contrib.django.conf import leaseq_settings
from leaseq.contrib.django.worker import worker_app


class Command(BaseCommand):  # type: ignore[misc]  # Django has no inline types
    help = (
        "Run leaseq's worker: the handlers of settings.LEASEQ['APP'] and the tasks of "
        "every LeaseqBackend in settings.TASKS. SIGTERM/SIGINT: finish running jobs, "
        "then stop (a second signal: now)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--queues",
            "-q",
            nargs="+",
            default=None,
            help="Queues to work (default: every queue of the app and of TASKS).",
        )
        parser.add_argument(
            "--concurrency", "-c", type=int, default=None, help="Jobs at a time (default: 10)."
        )
        parser.add_argument("--lease", type=float, default=None, help="Lease seconds.")
        parser.add_argument("--poll-interval", type=float, default=1.0)
        parser.add_argument(
            "--no-listen",
            action="store_true",
            help="No LISTEN for wake-ups: polling only (LISTEN cannot reach the server).",
        )
        parser.add_argument("--shutdown-grace", type=float, default=30.0)
        parser.add_argument(
            "--no-maintenance",
            action="store_true",
            help="Take no part in the reaper's and retention's leader election.",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        config = leaseq_settings()
        queues = options["queues"]
        app = worker_app(queues)
        if not app.tasks:
            raise CommandError(
                "nothing to run: set settings.LEASEQ['APP'], or a LeaseqBackend in "
                "settings.TASKS, or pass --queues"
            )
        # (0 is a value given, not a missing one: the Worker refuses it.)
        concurrency = options["concurrency"]
        try:
            worker = Worker(
                app,
                queues=queues,
                concurrency=config.concurrency if concurrency is None else concurrency,
                lease=options["lease"],
                poll_interval=options["poll_interval"],
                listen=not options["no_listen"],
                shutdown_grace=options["shutdown_grace"],
                maintenance=not options["no_maintenance"],
            )
        except InvalidArgument as exc:  # an option out of its range: one line, as the CLI's
            raise CommandError(str(exc)) from exc
        # The handlers run in threads, each with Django connections of its own.
        connections.close_all()
        self.stdout.write(f"leaseq worker: queues {', '.join(worker.queues)} (pid {os.getpid()})")
        self.stdout.flush()
        try:
            asyncio.run(worker.run(install_signal_handlers=True))
        except asyncio.CancelledError:
            os._exit(1)  # a second signal: leave now; unfinished leases expire
