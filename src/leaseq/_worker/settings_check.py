"""The checks of a Worker's settings: each refused at construction with a clear
InvalidArgument, before anything connects (with no DSN given, looking it up
starts the embedded server)."""

from __future__ import annotations

from collections.abc import Sequence

from .. import _metrics
from .. import _validate as validate
from .._errors import InvalidArgument
from .._metrics import Metrics
from .app import App
from .state import LEASE_MARGIN_FRACTION

#: A day: a poll interval, shutdown grace or maintenance interval past it is a
#: unit mistake (milliseconds given as seconds).
MAX_INTERVAL_SECONDS = 86400.0
#: The most jobs one worker runs at once.
MAX_CONCURRENCY = 10_000
#: The latest a lease is renewed, as a fraction of it: the worker stops trusting
#: a lease whose renewal is not confirmed LEASE_MARGIN_FRACTION before its end
#: (.state), and the renewal loop looks every quarter of the fraction (up to a
#: second) and then waits for the database. 0.9 was accepted, and every job
#: longer than 80 % of its lease was lost before its first renewal was due.
MAX_RENEW_FRACTION = 0.5


def check_settings(
    app: App,
    *,
    queues: Sequence[str] | None,
    concurrency: int,
    lease: float | None,
    poll_interval: float,
    listen: bool,
    listen_dsn: str | None,
    renew_fraction: float,
    shutdown_grace: float,
    maintenance: bool,
    maintenance_interval: float,
    metrics: Metrics | None,
    durable_acknowledgements: bool,
    dsn: str | None,
) -> None:
    """Refuse what a Worker cannot run with (InvalidArgument)."""
    if not isinstance(app, App):
        raise InvalidArgument(f"a Worker runs a leaseq.App, got {app!r}")
    if not app.tasks:
        raise InvalidArgument("the app has no tasks")
    if queues is not None and (
        isinstance(queues, str) or not all(isinstance(q, str) for q in queues)
    ):  # (a string would be read as its letters)
        raise InvalidArgument(f"queues must be a list of queue names, got {queues!r}")
    for flag, name in (
        (listen, "listen"),
        (maintenance, "maintenance"),
        (durable_acknowledgements, "durable_acknowledgements"),
    ):
        validate.flag(flag, name)
    unknown = set(queues or ()) - set(app.tasks)
    if unknown:
        raise InvalidArgument(f"no handler for queues: {', '.join(sorted(unknown))}")
    # Typed first: 1.5 failed only in run(), and "2" with a TypeError.
    if validate.positive_int(concurrency, "concurrency") > MAX_CONCURRENCY:
        raise InvalidArgument(f"concurrency must be between 1 and {MAX_CONCURRENCY}")
    if (
        isinstance(renew_fraction, bool)
        or not isinstance(renew_fraction, int | float)
        or not 0 < renew_fraction <= MAX_RENEW_FRACTION  # (NaN is not)
    ):
        raise InvalidArgument(
            f"renew_fraction must be a number above 0 and at most {MAX_RENEW_FRACTION:g} "
            "(a later renewal may come after the worker stops trusting the lease, "
            f"{1 - LEASE_MARGIN_FRACTION:.0%} of it in: every longer job lost), "
            f"got {renew_fraction!r}"
        )
    # Checked before the DSN is looked up: with none given, that starts a server.
    validate.dsn(dsn, "dsn")
    validate.dsn(listen_dsn, "listen_dsn")
    # 0 or less would claim in a busy loop (and a burst never end); NaN, for ever.
    validate.seconds(poll_interval, "poll_interval", MAX_INTERVAL_SECONDS, allow_zero=False)
    validate.seconds(shutdown_grace, "shutdown_grace", MAX_INTERVAL_SECONDS)
    validate.seconds(
        maintenance_interval, "maintenance_interval", MAX_INTERVAL_SECONDS, allow_zero=False
    )
    validate.lease(lease)
    _metrics.checked(metrics)
