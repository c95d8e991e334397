"""Commands that run something: migrate, worker, maintenance, demo."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from typing import Any

import click

from leaseq import (
    App,
    AsyncQueue,
    InvalidArgument,
    InvalidDatabaseURL,
    Maintenance,
    NotMigrated,
    Worker,
)

from .._config import configured_database_url
from .._redact import redact, remember_dsn
from .._worker.settings_check import DEFAULT_RENEW_FRACTION, MAX_CONCURRENCY, check_settings
from .._worker.supervisor import SETUP_FAILED, Supervisor
from .common import (
    _remember_url,
    bound_socket,
    cli,
    configure_logging,
    database_options,
    log_format_option,
    open_queue,
    scrubbed_crash,
)
from .serving import (
    MAINTENANCE_METRICS_PORT_HELP,
    WORKER_METRICS_PORT_HELP,
    leave,
    metrics_options,
    run_leaving_stragglers,
    seconds,
    serving_metrics,
)

#: --processes' ceiling: past it, a typo (an extra digit) forks the machine to a halt.
MAX_PROCESSES = 1024


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
# Ranges checked before anything starts, as usage errors (exit 2): a worker
# refused --concurrency 0 only once it had loaded its app and, under
# --processes, in each child (exit 78), and --processes -1 after the app's import.
@click.option(
    "--concurrency",
    "-c",
    type=click.IntRange(1, MAX_CONCURRENCY),
    default=10,
    show_default=True,
    help="Jobs per process.",
)
@click.option(
    "--processes",
    "-p",
    type=click.IntRange(1, MAX_PROCESSES),
    default=1,
    show_default=True,
    help="Worker processes.",
)
@click.option(
    "--lease",
    type=float,
    callback=seconds(),
    default=None,
    help="Lease seconds (default: per queue).",
)
@click.option("--poll-interval", type=float, callback=seconds(), default=1.0, show_default=True)
@click.option(
    "--listen/--no-listen",
    default=True,
    show_default=True,
    help="LISTEN for wake-ups; --no-listen: polling only (LISTEN cannot reach the server).",
)
@click.option(
    "--listen-database-url",
    default=None,
    callback=_remember_url,
    help="A direct URL just for LISTEN.",
)
@click.option(
    "--shutdown-grace", type=float, callback=seconds(zero=True), default=30.0, show_default=True
)
@click.option(
    "--maintenance/--no-maintenance",
    default=True,
    show_default=True,
    help="Take part in the leader election for the reaper and retention.",
)
@click.option(
    "--maintenance-interval", type=float, callback=seconds(), default=5.0, show_default=True
)
@click.option(
    "--durable-acknowledgements/--no-durable-acknowledgements",
    default=True,
    show_default=True,
    help="Wait for the WAL flush when acknowledging outcomes; --no-...: faster, and a "
    "database crash may run the last acknowledged jobs again.",
)
@click.option(
    "--burst",
    is_flag=True,
    help="Exit once no job is claimable now and none runs (no periodic jobs).",
)
@log_format_option
@metrics_options(WORKER_METRICS_PORT_HELP)
@database_options
def worker(app_reference: str, processes: int, **options: Any) -> None:
    """Run the handlers of MODULE:APP."""
    # Before the app's module is imported: one that sets up logging at import
    # (logging.basicConfig()) made this a no-op, and --log-format json was not
    # what came out. (The supervisor's own lines too, under --processes.)
    configure_logging(options["log_format"])
    # Fail early, in the parent: on a bad reference, and on what a Worker refuses
    # (a --schema, a --queues without a handler), which under --processes each
    # child refused once started; with no URL set, before the embedded server starts.
    try:
        _check_worker(load_app(app_reference), options)
    except InvalidArgument as exc:
        if processes == 1:
            raise
        # The exit status a child's refusal gives (a service manager told not to
        # restart on it), said once, before any child starts.
        click.echo(f"error: {redact(str(exc))}", err=True)
        sys.exit(SETUP_FAILED)
    _check_metrics_ports(options["metrics_port"], options["metrics_host"], processes)
    if processes == 1:
        _run_worker(app_reference, options)
        return
    supervisor = Supervisor(
        processes,
        _run_worker_process,
        (app_reference, options),
        shutdown_timeout=options["shutdown_grace"] + 30,
        done_on_clean_exit=options["burst"],  # a burst child is done once idle
    )
    sys.exit(supervisor.run())


def load_app(reference: str) -> App:
    """The App of MODULE:APP, its module found in the current directory too, as
    `python -m`, uvicorn and celery find theirs: `leaseq worker myjobs:app` runs
    where myjobs.py is (the `leaseq` script's path holds only the script's folder)."""
    here = os.getcwd()
    if here not in sys.path:
        sys.path.insert(0, here)
    return App.load(reference)


def _check_worker(app: App, options: dict[str, Any]) -> None:
    """Refuse (InvalidArgument) what the Worker of ``options`` would refuse, nothing
    connected or started."""
    _apply_schema(app, options["schema"])
    check_settings(
        app,
        queues=options["queues"] or None,
        concurrency=options["concurrency"],
        lease=options["lease"],
        poll_interval=options["poll_interval"],
        listen=options["listen"],
        listen_dsn=options["listen_database_url"],
        renew_fraction=DEFAULT_RENEW_FRACTION,
        shutdown_grace=options["shutdown_grace"],
        maintenance=options["maintenance"],
        maintenance_interval=options["maintenance_interval"],
        metrics=None,
        durable_acknowledgements=options["durable_acknowledgements"],
        dsn=options["database_url"],
    )


def _apply_schema(app: App, schema: str) -> None:
    """--schema on the app, unless left at its default and the app names its own."""
    if schema != "leaseq" or app.schema == "leaseq":
        app.schema = schema


def _check_metrics_ports(port: int | None, host: str, processes: int) -> None:
    """Fail early, in the parent, on a metrics port taken: each process serves
    PORT + its slot, and a child that cannot bind its port crashed at start, to be
    restarted and crash again forever, the worker a process short."""
    if not port:  # none, or 0 (any free port)
        return
    if port + processes - 1 > 65535:
        # Checked before any probe: getaddrinfo wraps 65536 to 0, "any port".
        raise InvalidArgument(
            f"--metrics-port {port} with --processes {processes} needs ports up to "
            f"{port + processes - 1}; the highest is 65535"
        )
    hint = f"; each of the {processes} processes serves PORT + its number"
    for taken in range(port, port + processes):
        bound_socket(host, taken, "--metrics-port", hint).close()  # a probe: closed again


def _run_worker_process(app_reference: str, options: dict[str, Any], slot: int) -> None:
    """A child of --processes: a fresh process, whose crash nobody above it scrubs."""
    configured_database_url(options["database_url"])  # remembers it, and the environment's
    if options["listen_database_url"]:
        remember_dsn(options["listen_database_url"])
    with scrubbed_crash():
        try:
            _run_worker(app_reference, options, slot)
        # The Worker's setup errors: a setting it refuses (a schema name, a queue
        # without a handler...), a schema not migrated, a URL no one can parse.
        except (InvalidArgument, NotMigrated, InvalidDatabaseURL) as exc:
            # Said once, in one line; the supervisor does not restart it.
            click.echo(f"error: {redact(str(exc))}", err=True)
            sys.exit(SETUP_FAILED)


def _run_worker(app_reference: str, options: dict[str, Any], slot: int = 0) -> None:
    configure_logging(options["log_format"])
    app = load_app(app_reference)
    _apply_schema(app, options["schema"])
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
        durable_acknowledgements=options["durable_acknowledgements"],
    )
    port = options["metrics_port"]
    if port:  # port 0 (any free port) stays 0 in every process
        port += slot
    try:
        # The gauges of what this worker works: the app's schema (which --schema's
        # default leaves alone) in the database the worker resolved, maybe the app's.
        with serving_metrics(
            port, options["metrics_host"], runner.dsn, app.schema, database=slot == 0
        ):
            run_leaving_stragglers(runner.run(install_signal_handlers=True, burst=options["burst"]))
    except asyncio.CancelledError:
        # A second signal: leave now; unfinished leases expire and are recovered.
        leave(1)


@cli.command()
@click.option("--once", is_flag=True, help="Exit after the burst (for tests and CI).")
# Ranges checked before anything starts: without a worker (--processes 0) or a
# job slot (--concurrency 0) the burst never ended, or ended in "worker 0 did not
# start"; a port past 65535 in an OverflowError; no requests in CHECKS FAILED.
@click.option(
    "--requests",
    type=click.IntRange(min=1),
    default=60,
    show_default=True,
    help="Report requests to submit.",
)
@click.option(
    "--processes",
    type=click.IntRange(min=1),
    default=2,
    show_default=True,
    help="Worker processes.",
)
@click.option(
    "--concurrency",
    type=click.IntRange(min=1),
    default=4,
    show_default=True,
    help="Jobs per worker process.",
)
@click.option("--kill-worker", is_flag=True, help="SIGKILL one worker in the middle of the burst.")
@click.option(
    "--port",
    type=click.IntRange(0, 65535),
    default=8000,
    show_default=True,
    help="HTTP port on 127.0.0.1 (0: any).",
)
@click.option(
    "--database-url",
    default=None,
    callback=_remember_url,
    help="Else $LEASEQ_DATABASE_URL, $DATABASE_URL, else the embedded server under ./.leaseq/.",
)
def demo(database_url: str | None, **options: Any) -> None:
    """Run the report-generation demo: HTTP service, workers, a burst of requests."""
    try:
        from ..demo.run import run_demo  # noqa: PLC0415 - needs the optional demo extra
    except ImportError as exc:
        raise InvalidArgument(
            f"the demo needs its extra: pip install 'leaseq[demo]' ({exc.name} is missing)"
        ) from exc
    sys.exit(run_demo(database_url, **options))


@cli.command()
@click.option("--interval", type=float, callback=seconds(), default=5.0, show_default=True)
@log_format_option
@metrics_options(MAINTENANCE_METRICS_PORT_HELP)
@database_options
def maintenance(
    *,
    interval: float,
    log_format: str,
    metrics_port: int | None,
    metrics_host: str,
    database_url: str | None,
    schema: str,
) -> None:
    """Run the reaper, retention and (when autovacuum is off) the job table's vacuum
    as their own process (one leader per schema); with --metrics-port, also serve
    the queues' gauges."""
    _check_metrics_ports(metrics_port, metrics_host, 1)
    configure_logging(log_format)

    async def run() -> None:
        main = asyncio.current_task()
        assert main is not None
        for signum in (signal.SIGTERM, signal.SIGINT):
            asyncio.get_running_loop().add_signal_handler(signum, main.cancel)
        async with AsyncQueue(database_url, schema=schema, pool_size=1) as queue:
            with contextlib.suppress(asyncio.CancelledError):
                await Maintenance(queue, interval=interval).run()

    with serving_metrics(metrics_port, metrics_host, database_url, schema, database=True):
        asyncio.run(run())
