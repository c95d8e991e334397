"""The settings of the connections leaseq opens (libpq keywords and server options)."""

from __future__ import annotations

import os
from typing import Any

from psycopg.conninfo import conninfo_to_dict

#: Sent with every connection leaseq opens; keepalives notice a dead peer.
CONNECTION_OPTIONS: dict[str, Any] = {
    "autocommit": True,
    "application_name": "leaseq",
    "keepalives": 1,
    "keepalives_idle": 10,
    "keepalives_interval": 5,
    "keepalives_count": 3,
}

#: Added for worker sessions: a dead server is noticed within ~30 s even while a
#: write is unacknowledged, and no session idles in a transaction for long.
WORKER_OPTIONS: dict[str, Any] = {
    **CONNECTION_OPTIONS,
    "tcp_user_timeout": 30_000,
    "options": "-c idle_in_transaction_session_timeout=60000",
}

#: For the worker's own sessions, which send nothing but leaseq's statements
#: (claims, renewals, acknowledgements): every prepared statement keeps one
#: generic plan, and nothing is compiled. Left to choose, the server re-planned
#: the claim on every call (its custom plans looked cheaper than a generic one),
#: which took ~0.5 ms of an empty claim's ~0.8 ms. A generic plan cannot see
#: the LIMIT, so over a large backlog its estimated cost passes jit_above_cost
#: and JIT compiled the claim on every call (~30 ms with 100,000 queued); these
#: statements touch a handful of rows and never gain from JIT. The generic plan
#: reads the same partial indexes (tests/test_plans.py).
#:
#: And no sequential scans, hash or merge joins: each of these statements reads
#: a handful of rows by key, and its one generic plan is made at its first call,
#: often on a young job table, where a scan of the whole table looks cheapest.
#: That plan is then kept while the table grows, until a VACUUM or ANALYZE
#: replans it: every acknowledgement and renewal scanned the whole table (a
#: fresh queue at 3,100 jobs/s: the completion went from 0.9 ms to 7 ms in four
#: seconds, and start latency to a second, until the first vacuum). Never for
#: sessions that run an application's queries.
SERVICE_OPTIONS: dict[str, Any] = {
    **WORKER_OPTIONS,
    "options": (
        f"{WORKER_OPTIONS['options']} -c plan_cache_mode=force_generic_plan -c jit=off"
        " -c enable_seqscan=off -c enable_hashjoin=off -c enable_mergejoin=off"
    ),
}


#: For the worker's acknowledgement session when the application opts out of
#: durable acknowledgements (``Worker(durable_acknowledgements=False)``): its
#: completions, retries, failures and releases commit without waiting for the
#: WAL flush. Claims keep waiting for it: a claim lost in a crash would hand its
#: lease_version out again. An acknowledgement lost in a server crash leaves its
#: job running under an expired lease, which is recovered and run again, as
#: after a worker crash; any later durable commit (the next claim) makes every
#: earlier one durable too, since the WAL is one sequence. Measured at
#: concurrency 50: the claim's commit no longer waits behind the
#: acknowledgement's flush (bench/README.md).
ASYNC_ACKNOWLEDGEMENT_OPTIONS: dict[str, Any] = {
    **SERVICE_OPTIONS,
    "options": f"{SERVICE_OPTIONS['options']} -c synchronous_commit=off",
}


def with_statement_timeout(options: dict[str, Any] | None, seconds: float) -> dict[str, Any]:
    """Connection settings under which the server cancels any statement running
    longer than ``seconds`` (SQLSTATE 57014, raised as StatementTimeout)."""
    settings = dict(options or CONNECTION_OPTIONS)
    given = settings.get("options", "")
    # The server counts whole milliseconds and takes 0 as no timeout at all: a
    # timeout under half a millisecond is one. (The clients refuse 0 themselves.)
    milliseconds = max(1, round(seconds * 1000))
    settings["options"] = f"{given} -c statement_timeout={milliseconds}".strip()
    return settings


def under_the_url(dsn: str, options: dict[str, Any]) -> dict[str, Any]:
    """``options`` as they must be sent with ``dsn``: psycopg's keyword arguments
    override the URL's own keys, so the URL's server options (a search_path and
    a lock_timeout the application's queries rely on, a provider's
    ``endpoint=``) were dropped from every connection leaseq made with its own
    (a worker's handlers, a client with a statement_timeout), and its
    application_name replaced. The URL's options (else PGOPTIONS) now come
    first and leaseq's after them, which win where both set one; its
    application_name (else PGAPPNAME) is kept."""
    try:
        given = conninfo_to_dict(dsn)
    except Exception:  # not parsable: reported by the first connection's error
        return options
    merged = dict(options)
    url_options = given.get("options") or os.environ.get("PGOPTIONS")
    if url_options and merged.get("options"):
        merged["options"] = f"{url_options} {merged['options']}"
    if given.get("application_name") or os.environ.get("PGAPPNAME"):
        merged.pop("application_name", None)
    return merged
