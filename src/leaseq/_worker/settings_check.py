"""The checks of a Worker's settings: each refused at construction with a clear
InvalidArgument, before anything connects (with no DSN given, looking it up
starts the embedded server)."""

from __future__ import annotations

from collections.abc import Iterable

from .. import _metrics
from .. import _validate as validate
from .._errors import InvalidArgument
from .._metrics import Metrics
from .._redact import redact
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
#: The default: a lease renewed a third of the way in, and twice more before it ends.
DEFAULT_RENEW_FRACTION = 1 / 3


def check_settings(
    app: App,
    *,
    queues: Iterable[str] | None,
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
) -> list[str]:
    """Refuse what a Worker cannot run with (InvalidArgument); return the queues it
    serves (``queues`` read once, else every queue of the app)."""
    if not isinstance(app, App):
        raise InvalidArgument(f"a Worker runs a leaseq.App, got {app!r}")
    if not app.tasks:
        raise InvalidArgument("the app has no tasks")
    served = list(app.tasks) if queues is None else queue_names(queues)
    for flag, name in (
        (listen, "listen"),
        (maintenance, "maintenance"),
        (durable_acknowledgements, "durable_acknowledgements"),
    ):
        validate.flag(flag, name)
    unknown = set(served) - set(app.tasks)
    if unknown:
        raise InvalidArgument(redact(f"no handler for queues: {', '.join(sorted(unknown))}"))
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
    # (The app's schema too: the CLI's --schema is set on the app after its
    # construction, and was refused only once the embedded server had started.)
    validate.schema_name(app.schema)
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
    return served


def queue_names(queues: object) -> list[str]:
    """``queues`` read once into a list of names (a repeated name once, in the
    order given: each asked once per turn), or InvalidArgument.

    Read once because any iterable is accepted, a generator too: the check used
    to walk it and the worker then read it again, used up, and served no queue
    at all (its claim loop then failed on the empty list, the jobs left queued).
    """
    shown = redact(repr(queues))  # (a DSN passed here by mistake keeps its password)
    if isinstance(queues, str | bytes):  # it would be read as its letters
        raise InvalidArgument(
            f"queues must be a list of queue names, not a single string: got {shown}"
        )
    if not isinstance(queues, Iterable):  # (5 failed with a bare TypeError)
        raise InvalidArgument(f"queues must be a list of queue names, got {shown}")
    served = list(queues)
    for name in served:
        if not isinstance(name, str):
            raise InvalidArgument(
                f"queues must be a list of queue names, got {redact(repr(name))} among them"
            )
    if not served:
        # It used to mean every queue of the app (read as `queues or app.tasks`): a
        # list meant to narrow the worker down that came out empty (a filter, an
        # unset variable) made it serve everything instead.
        raise InvalidArgument(
            "queues is empty: name at least one queue, or leave queues out (None) "
            "to serve every queue of the app"
        )
    return list(dict.fromkeys(served))
