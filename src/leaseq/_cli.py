"""The ``leaseq`` command: a thin shell over the client, worker and maintenance.

Everything it prints that it did not write itself (errors, tracebacks, log
records, stored job errors) goes through :func:`leaseq._redact.redact` first.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import sys
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import click
from rich import box
from rich.console import Console
from rich.logging import RichHandler
from rich.table import Table
from rich.text import Text

from leaseq import (
    App,
    AsyncQueue,
    DatabaseUnavailable,
    InvalidArgument,
    Job,
    JobStatus,
    LeaseqError,
    Maintenance,
    Queue,
    TransientError,
    Worker,
)

from ._config import configured_database_url
from ._logs import RedactingFilter
from ._redact import redact, remember_dsn
from ._worker.supervisor import Supervisor

F = TypeVar("F", bound=Callable[..., Any])
# Piped output (CI logs, scripts) gets room for whole tables instead of 80 columns.
console = Console(width=None if sys.stdout.isatty() else 200)


def _remember_url(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """A URL option's password is known to redact before anything can fail."""
    if value:
        remember_dsn(value)
    return value


def database_options(command: F) -> F:
    """--database-url and --schema on every command, with the library's fallbacks."""
    command = click.option(
        "--schema",
        default="leaseq",
        show_default=True,
        envvar="LEASEQ_SCHEMA",
        help="The schema leaseq's tables live in.",
    )(command)
    return click.option(
        "--database-url",
        default=None,
        callback=_remember_url,
        help="PostgreSQL URL. Default: $LEASEQ_DATABASE_URL, $DATABASE_URL, else the "
        "embedded server under ./.leaseq/.",
    )(command)


@contextmanager
def open_queue(database_url: str | None, schema: str) -> Iterator[Queue]:
    # One-shot commands: fail within seconds, with one line, if the server is away.
    logging.getLogger("psycopg.pool").setLevel(logging.CRITICAL)
    with Queue(database_url, schema=schema, pool_size=2, connect_timeout=5) as queue:
        yield queue


class CommandError(click.ClickException):
    """A leaseq error or an unreachable database: one line on stderr, exit 1."""

    def show(self, file: Any = None) -> None:
        click.echo(f"error: {redact(self.message)}", err=True)


class LeaseqGroup(click.Group):
    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except TransientError as exc:
            reason = str(exc).strip().splitlines()[0] if str(exc).strip() else repr(exc)
            if not isinstance(exc, DatabaseUnavailable):  # (which says so itself)
                reason = f"cannot reach the database: {reason}"
            raise CommandError(redact(reason)) from exc
        except LeaseqError as exc:
            raise CommandError(redact(str(exc))) from exc


@contextmanager
def scrubbed_crash() -> Iterator[None]:
    """An unexpected error still ends the process with its traceback, but scrubbed:
    it may quote a DSN (libpq quotes a password it cannot percent-decode)."""
    try:
        yield
    except Exception:
        sys.stderr.write(redact(traceback.format_exc()))
        sys.exit(1)


@click.group(cls=LeaseqGroup)
@click.version_option(package_name="leaseq")
def cli() -> None:
    """leaseq: reliable background jobs on PostgreSQL."""
    configured_database_url()  # remembers the environment's URLs before anything can fail


@cli.command()
@database_options
def migrate(database_url: str | None, schema: str) -> None:
    """Create or upgrade leaseq's schema (safe to run concurrently)."""
    with open_queue(database_url, schema) as queue:
        applied = queue.migrate()
    click.echo(f"applied migrations {applied}" if applied else "schema is up to date")


@cli.command()
@click.argument("app_reference", metavar="MODULE:APP")
@click.option("--queues", "-q", multiple=True, help="Queues to work (default: all the app's).")
@click.option("--concurrency", "-c", default=10, show_default=True, help="Jobs per process.")
@click.option("--processes", "-p", default=1, show_default=True, help="Worker processes.")
@click.option("--lease", type=float, default=None, help="Lease seconds (default: per queue).")
@click.option("--poll-interval", type=float, default=1.0, show_default=True)
@click.option(
    "--listen/--no-listen",
    default=True,
    show_default=True,
    help="LISTEN for wake-ups; --no-listen for PgBouncer transaction pooling.",
)
@click.option(
    "--listen-database-url",
    default=None,
    callback=_remember_url,
    help="A direct URL just for LISTEN.",
)
@click.option("--shutdown-grace", type=float, default=30.0, show_default=True)
@click.option(
    "--maintenance/--no-maintenance",
    default=True,
    show_default=True,
    help="Take part in the leader election for the reaper.",
)
@click.option("--maintenance-interval", type=float, default=5.0, show_default=True)
@database_options
def worker(app_reference: str, processes: int, **options: Any) -> None:
    """Run the handlers of MODULE:APP."""
    App.load(app_reference)  # fail early, in the parent, on a bad reference
    if processes < 1:
        raise InvalidArgument("--processes must be at least 1")
    if processes == 1:
        _run_worker(app_reference, options)
        return
    supervisor = Supervisor(
        processes,
        _run_worker_process,
        (app_reference, options),
        shutdown_timeout=options["shutdown_grace"] + 30,
    )
    sys.exit(supervisor.run())


def _run_worker_process(app_reference: str, options: dict[str, Any]) -> None:
    """A child of --processes: a fresh process, whose crash nobody above it scrubs."""
    configured_database_url(options["database_url"])  # remembers it, and the environment's
    if options["listen_database_url"]:
        remember_dsn(options["listen_database_url"])
    with scrubbed_crash():
        _run_worker(app_reference, options)


def _run_worker(app_reference: str, options: dict[str, Any]) -> None:
    _configure_logging()
    sys.path.insert(0, os.getcwd())
    app = App.load(app_reference)
    if options["schema"] != "leaseq" or app.schema == "leaseq":
        app.schema = options["schema"]
    runner = Worker(
        app,
        dsn=options["database_url"],
        queues=options["queues"] or None,
        concurrency=options["concurrency"],
        lease=options["lease"],
        poll_interval=options["poll_interval"],
        listen=options["listen"],
        listen_dsn=options["listen_database_url"],
        shutdown_grace=options["shutdown_grace"],
        maintenance=options["maintenance"],
        maintenance_interval=options["maintenance_interval"],
    )
    try:
        asyncio.run(runner.run(install_signal_handlers=True))
    except asyncio.CancelledError:
        # A second signal: leave now; unfinished leases expire and are recovered.
        os._exit(1)


@cli.command()
@click.option("--once", is_flag=True, help="Exit after the burst (for tests and CI).")
@click.option("--requests", default=60, show_default=True, help="Report requests to submit.")
@click.option("--processes", default=2, show_default=True, help="Worker processes.")
@click.option("--concurrency", default=4, show_default=True, help="Jobs per worker process.")
@click.option("--kill-worker", is_flag=True, help="SIGKILL one worker in the middle of the burst.")
@click.option("--port", default=8000, show_default=True, help="HTTP port on 127.0.0.1 (0: any).")
@click.option(
    "--database-url",
    default=None,
    callback=_remember_url,
    help="Else $LEASEQ_DATABASE_URL, $DATABASE_URL, else the embedded server under ./.leaseq/.",
)
def demo(database_url: str | None, **options: Any) -> None:
    """Run the report-generation demo: HTTP service, workers, a burst of requests."""
    try:
        from .demo.run import run_demo  # noqa: PLC0415 - needs the optional demo extra
    except ImportError as exc:
        raise InvalidArgument(
            f"the demo needs its extra: pip install 'leaseq[demo]' ({exc.name} is missing)"
        ) from exc
    sys.exit(run_demo(database_url, **options))


@cli.command()
@click.option("--interval", type=float, default=5.0, show_default=True)
@database_options
def maintenance(interval: float, database_url: str | None, schema: str) -> None:
    """Run the reaper as its own process (one leader per schema)."""
    _configure_logging()

    async def run() -> None:
        main = asyncio.current_task()
        assert main is not None
        for signum in (signal.SIGTERM, signal.SIGINT):
            asyncio.get_running_loop().add_signal_handler(signum, main.cancel)
        async with AsyncQueue(database_url, schema=schema, pool_size=1) as queue:
            with contextlib.suppress(asyncio.CancelledError):
                await Maintenance(queue, interval=interval).run()

    asyncio.run(run())


@cli.command()
@click.argument("queue_name", metavar="QUEUE")
@click.argument("payload", metavar="JSON")
@click.option("--delay", type=float, default=None, help="Seconds before it may run.")
@click.option("--key", default=None, help="Ordering key.")
@click.option("--seq", type=int, default=None, help="Sequence within the ordering key.")
@click.option("--priority", type=int, default=0, show_default=True, help="Higher runs first.")
@click.option("--max-attempts", type=int, default=None)
@database_options
def enqueue(
    queue_name: str, payload: str, database_url: str | None, schema: str, **options: Any
) -> None:
    """Enqueue one job whose payload is the JSON text given."""
    try:
        value = json.loads(payload)
    except json.JSONDecodeError as exc:
        raise InvalidArgument(f"payload is not valid JSON: {exc}") from None
    with open_queue(database_url, schema) as queue:
        job_id = queue.enqueue(queue_name, value, **options)
    click.echo(job_id)


@cli.command()
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option("--queue", "queue_name", default=None)
@database_options
def status(as_json: bool, queue_name: str | None, database_url: str | None, schema: str) -> None:
    """Per queue: jobs by state, queued bytes, oldest ready age, expired leases."""
    with open_queue(database_url, schema) as queue:
        stats = queue.stats(queue_name)
    if as_json:
        rows = [
            {
                "queue": s.queue,
                **{k.value: v for k, v in s.counts.items()},
                "queued_bytes": s.queued_bytes,
                "oldest_ready_age": s.oldest_ready_age,
                "expired_leases": s.expired_leases,
                "paused": s.paused,
            }
            for s in stats
        ]
        click.echo(json.dumps(rows, indent=2))
        return
    table = Table(title="leaseq status", box=box.SIMPLE_HEAD)
    width = max((len(s.queue) + 9 for s in stats), default=5)
    table.add_column("queue", no_wrap=True, min_width=width)
    for heading in (*(state.value for state in JobStatus), "bytes", "oldest", "expired"):
        table.add_column(heading, justify="right", no_wrap=True)
    for s in stats:
        age = "-" if s.oldest_ready_age is None else f"{s.oldest_ready_age:.1f}s"
        name = s.queue + (" (paused)" if s.paused else "")
        table.add_row(
            name,
            *(str(s.counts[k]) for k in JobStatus),
            str(s.queued_bytes),
            age,
            str(s.expired_leases),
        )
    console.print(table)


@cli.command()
@click.option("--queue", "queue_name", default=None)
@click.option("--limit", default=50, show_default=True)
@database_options
def failed(queue_name: str | None, limit: int, database_url: str | None, schema: str) -> None:
    """List failed jobs with their last error and attempts."""
    with open_queue(database_url, schema) as queue:
        jobs = queue.list_jobs(JobStatus.FAILED, queue=queue_name, limit=limit)
    _print_jobs(jobs, "failed jobs")


def _print_jobs(jobs: list[Job], title: str) -> None:
    table = Table("job", "queue", "attempts", "finished", title=title, box=box.SIMPLE_HEAD)
    table.add_column("last error", overflow="fold")
    for job in jobs:
        finished = job.finished_at.isoformat(timespec="seconds") if job.finished_at else "-"
        table.add_row(
            str(job.job_id),
            job.queue,
            f"{job.attempts}/{job.max_attempts}",
            finished,
            Text(redact(job.last_error or "")),
        )
    console.print(table)


@cli.command()
@click.argument("job_id", type=int, required=False)
@click.option("--queue", "queue_name", default=None)
@click.option("--all-failed", is_flag=True, help="Replay every failed job of --queue.")
@database_options
def replay(
    job_id: int | None,
    queue_name: str | None,
    all_failed: bool,
    database_url: str | None,
    schema: str,
) -> None:
    """Put a failed or cancelled job back in its queue (same id, fresh attempts)."""
    if (job_id is None) == (not all_failed):
        raise InvalidArgument("give a JOB_ID, or --queue Q --all-failed")
    with open_queue(database_url, schema) as queue:
        if all_failed:
            if queue_name is None:
                raise InvalidArgument("--all-failed needs --queue")
            ids = queue.replay_failed(queue_name)
            click.echo(f"replayed {len(ids)} jobs")
        else:
            assert job_id is not None
            if not queue.replay(job_id):
                raise InvalidArgument(f"job {job_id} is {queue.get(job_id).status}: not replayed")
            click.echo(f"replayed job {job_id}")


@cli.command()
@click.argument("job_id", type=int)
@database_options
def cancel(job_id: int, database_url: str | None, schema: str) -> None:
    """Cancel a queued job, or skip a failed one."""
    with open_queue(database_url, schema) as queue:
        if not queue.cancel(job_id):
            raise InvalidArgument(f"job {job_id} is {queue.get(job_id).status}: not cancelled")
    click.echo(f"cancelled job {job_id}")


@cli.command()
@database_options
def reap(database_url: str | None, schema: str) -> None:
    """Fail jobs with no attempts left (queued, or running with an expired lease)."""
    with open_queue(database_url, schema) as queue:
        result = queue.reap()
    click.echo(
        f"failed {len(result)} exhausted jobs" + (f": {list(result.failed)}" if result else "")
    )


@cli.group("queue")
def queue_group() -> None:
    """Per-queue settings."""


@queue_group.command("configure")
@click.argument("name")
@click.option("--lease", type=float, default=None, help="Lease seconds.")
@click.option("--max-attempts", type=int, default=None)
@click.option("--backoff-base", type=float, default=None)
@click.option("--backoff-cap", type=float, default=None)
@click.option("--ordering-policy", type=click.Choice(["block", "continue"]), default=None)
@click.option("--max-queued", "max_queued_jobs", type=int, default=None)
@click.option("--max-queued-bytes", type=int, default=None)
@click.option("--max-payload-bytes", type=int, default=None)
@click.option("--pause/--resume", "paused", default=None)
@database_options
def configure(name: str, database_url: str | None, schema: str, **settings: Any) -> None:
    """Change a queue's settings; options not given stay as they are."""
    given = {key: value for key, value in settings.items() if value is not None}
    with open_queue(database_url, schema) as queue:
        result = queue.configure_queue(name, **given)
    click.echo(
        f"queue {result.name}: lease={result.lease:g}s max_attempts={result.max_attempts} "
        f"backoff={result.backoff_base:g}..{result.backoff_cap:g}s "
        f"ordering={result.ordering_policy.value} max_queued={result.max_queued_jobs} "
        f"max_queued_bytes={result.max_queued_bytes} "
        f"max_payload_bytes={result.max_payload_bytes} paused={result.paused}"
    )


def _configure_logging() -> None:
    handler = RichHandler(console=Console(stderr=True), show_path=False)
    # leaseq's own loggers scrub their records; this catches everyone else's
    # (the driver's pool, asyncio's "exception was never retrieved"...).
    handler.addFilter(RedactingFilter())
    logging.basicConfig(
        level=os.environ.get("LEASEQ_LOG_LEVEL", "INFO"), format="%(message)s", handlers=[handler]
    )


def main() -> None:
    with scrubbed_crash():
        cli()


if __name__ == "__main__":
    main()
