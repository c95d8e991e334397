"""What the long-running commands share: their seconds options checked, the
``--metrics-*`` options and ``/metrics`` served while a command runs, and an
event loop that tasks deaf to their cancellation cannot keep alive."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Callable, Coroutine, Iterator
from typing import Any

import click

from leaseq import Queue, metrics

from .._logs import get_logger

log = get_logger("leaseq.cli")

#: How long ``leaseq worker`` waits, once its worker has stopped, for tasks it then
#: cancels (a handler that swallows cancellation would keep the process for ever).
STRAGGLER_WAIT = 1.0


#: A day: as the Worker's own check, past it an option is a unit mistake.
MAX_OPTION_SECONDS = 86400.0


def seconds(*, zero: bool = False) -> Any:
    """An option callback for the worker's seconds: finite, above 0 (or 0 with
    ``zero``), at most a day. Checked here, in the parent: a child of ``--processes
    N`` that the Worker refused would be restarted, to be refused again, for ever."""

    def check(ctx: click.Context, param: click.Parameter, value: float | None) -> float | None:
        if value is None:
            return None
        low = "0 or more" if zero else "more than 0"
        if not (value >= 0 if zero else value > 0) or not value <= MAX_OPTION_SECONDS:
            raise click.BadParameter(
                f"{value!r}: give {low} seconds, at most {MAX_OPTION_SECONDS:g}", ctx, param
            )
        return value

    return check


#: --metrics-port's help for the worker, whose --processes N serve a port each.
WORKER_METRICS_PORT_HELP = (
    "Serve Prometheus metrics on this port (with --processes N: PORT+i for the "
    "i-th process; the database gauges come from the first)."
)
#: --metrics-port's help for maintenance: one process, and no --processes to mention.
MAINTENANCE_METRICS_PORT_HELP = (
    "Serve Prometheus metrics, with the queues' gauges, on this port (0: any free port)."
)


def metrics_options(port_help: str) -> Callable[[Any], Any]:
    """--metrics-port / --metrics-host: serve leaseq.metrics' registry on /metrics.
    ``port_help``: each command says what its port serves (only the worker has
    --processes)."""

    def add(command: Any) -> Any:
        command = click.option(
            "--metrics-host",
            default="127.0.0.1",
            show_default=True,
            help="Address /metrics listens on.",
        )(command)
        return click.option(
            "--metrics-port",
            type=click.IntRange(0, 65535),
            default=None,
            help=port_help,
        )(command)

    return add


@contextlib.contextmanager
def serving_metrics(
    port: int | None, host: str, database_url: str | None, schema: str, *, database: bool
) -> Iterator[None]:
    """Serve ``/metrics`` while the block runs (nothing without a port); ``database``:
    with the queues' gauges, from one stats statement per scrape at most (cached)."""
    if port is None:
        yield
        return
    watcher = None
    if database:
        # Watched before the first scrape can come: served first, a scrape in
        # between was answered without the queues' gauges.
        watcher = Queue(database_url, schema=schema, pool_size=1, connect_timeout=5, metrics=None)
        metrics.watch(watcher)
    server = None
    try:
        server = metrics.serve(port, host)
        log.info("metrics on http://%s:%d/metrics", server.host, server.port)
        yield
    finally:
        if watcher is not None:
            metrics.watch(None)
            watcher.close()
        if server is not None:
            server.close()


def run_leaving_stragglers(main: Coroutine[Any, Any, None]) -> None:
    """``asyncio.run(main)``, except that tasks still running once ``main`` is over
    do not keep the process for ever. asyncio.run cancels them and waits; a
    handler that swallows its cancellation would never let it return. The worker
    has left its job to its lease by then, as it leaves a sync handler's thread."""
    loop = asyncio.new_event_loop()
    try:
        loop.run_until_complete(main)
    except BaseException:
        _cancel_what_is_left(loop, exit_code=1)
        loop.close()
        raise
    _cancel_what_is_left(loop, exit_code=0)
    loop.run_until_complete(loop.shutdown_asyncgens())
    _shut_down_default_executor(loop, exit_code=0)
    loop.close()


def _shut_down_default_executor(loop: asyncio.AbstractEventLoop, exit_code: int) -> None:
    """Shut the loop's default executor down; if one of its threads still runs
    after STRAGGLER_WAIT, exit without it. An async handler's
    ``asyncio.to_thread`` call runs on there once the handler is cancelled (its
    job given back), and a thread of that executor is joined at the loop's
    shutdown and again at the interpreter's exit: a hung call kept a stopped
    worker for ever."""
    shutting = loop.create_task(loop.shutdown_default_executor())
    done, _ = loop.run_until_complete(asyncio.wait({shutting}, timeout=STRAGGLER_WAIT))
    if not done:
        log.error("a thread of asyncio.to_thread still runs (a handler's call); exiting without it")
        leave(exit_code)


def _cancel_what_is_left(loop: asyncio.AbstractEventLoop, exit_code: int) -> None:
    """Cancel the loop's tasks; if some ignore it for STRAGGLER_WAIT, exit without them."""
    left = [task for task in asyncio.all_tasks(loop) if not task.done()]
    for task in left:
        task.cancel()
    if left:
        _, deaf = loop.run_until_complete(asyncio.wait(left, timeout=STRAGGLER_WAIT))
        if deaf:
            log.error("%d tasks ignored their cancellation; exiting without them", len(deaf))
            leave(exit_code)


def leave(code: int) -> None:
    """Exit now, whatever still runs (a thread, a task), the logs flushed first."""
    logging.shutdown()
    os._exit(code)
