"""A connection the server (or libpq) refuses for good: an unknown role or
database, an option value libpq rejects. No retry can connect with such a URL:
a client says so at once, typed (InvalidDatabaseURL), instead of waiting out its
connect timeout (30 s by default), and a worker stops instead of retrying for
ever. A server that is away is still waited for. (A wrong password, on a server
that asks for one: tests/test_secrets.py.)"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time

import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

import leaseq

#: Far longer than any test may wait: a call that waited for it fails the test.
PATIENT = 120.0
#: What a refusal may take (a connection attempt or two on a loaded machine).
AT_ONCE = 20.0


def _with(database_url: str, **changes: str) -> str:
    return make_conninfo(**{**conninfo_to_dict(database_url), **changes})


REFUSALS = {
    "unknown role": ({"user": "leaseq_no_such_role"}, 'role "leaseq_no_such_role" does not exist'),
    "unknown database": (
        {"dbname": "leaseq_no_such_database"},
        'database "leaseq_no_such_database" does not exist',
    ),
    "bad sslmode": ({"sslmode": "bogus"}, "invalid sslmode value"),
}


@pytest.mark.parametrize("case", REFUSALS)
def test_a_sync_client_says_at_once_that_the_url_is_refused(database_url: str, case: str) -> None:
    changes, reason = REFUSALS[case]
    url = _with(database_url, **changes)
    started = time.monotonic()
    with leaseq.Queue(url, connect_timeout=PATIENT) as queue:
        with pytest.raises(leaseq.InvalidDatabaseURL) as refused:
            queue.stats()
        assert reason in str(refused.value)
        assert isinstance(refused.value, leaseq.DatabaseUnavailable)  # as before its type
        with pytest.raises(leaseq.InvalidDatabaseURL):  # and again, not a pool left waiting
            queue.enqueue("work", {})
    assert time.monotonic() - started < AT_ONCE


@pytest.mark.parametrize("case", REFUSALS)
async def test_an_async_client_says_at_once_that_the_url_is_refused(
    database_url: str, case: str
) -> None:
    changes, reason = REFUSALS[case]
    async with leaseq.AsyncQueue(_with(database_url, **changes), connect_timeout=PATIENT) as queue:
        with pytest.raises(leaseq.InvalidDatabaseURL) as refused:
            await asyncio.wait_for(queue.stats(), AT_ONCE)
        assert reason in str(refused.value)


async def test_a_server_that_is_away_is_still_waited_for_and_not_refused_for_good() -> None:
    """Nothing listens there: that may change, so the client waits its timeout out
    and says the database is unavailable, not that the URL is wrong."""
    url = "postgresql://postgres@127.0.0.1:1/postgres"
    started = time.monotonic()
    async with leaseq.AsyncQueue(url, connect_timeout=2) as queue:
        with pytest.raises(leaseq.DatabaseUnavailable) as unavailable:
            await queue.stats()
    assert not isinstance(unavailable.value, leaseq.InvalidDatabaseURL)
    assert time.monotonic() - started >= 1.5  # tried for its timeout, not given up


def _two_hosts(database_url: str, first: tuple[str, str], **changes: str) -> str:
    """``database_url`` behind another host tried first (a failover URL)."""
    given = conninfo_to_dict(database_url)
    host, port = given.get("host") or "localhost", given.get("port") or "5432"
    return make_conninfo(
        **{**given, **changes, "host": f"{first[0]},{host}", "port": f"{first[1]},{port}"}
    )


async def test_with_several_hosts_a_refusal_is_for_good_only_if_every_host_refused(
    database_url: str,
) -> None:
    """A failover URL whose first host is away: that host may answer next time."""
    away = _two_hosts(database_url, ("127.0.0.1", "1"), user="leaseq_no_such_role")
    async with leaseq.AsyncQueue(away, connect_timeout=2) as queue:
        with pytest.raises(leaseq.DatabaseUnavailable) as unavailable:
            await asyncio.wait_for(queue.stats(), AT_ONCE)
    assert not isinstance(unavailable.value, leaseq.InvalidDatabaseURL)
    given = conninfo_to_dict(database_url)
    both = _two_hosts(
        database_url,
        (given.get("host") or "localhost", given.get("port") or "5432"),
        user="leaseq_no_such_role",
    )
    async with leaseq.AsyncQueue(both, connect_timeout=PATIENT) as queue:
        with pytest.raises(leaseq.InvalidDatabaseURL):
            await asyncio.wait_for(queue.stats(), AT_ONCE)


@pytest.mark.parametrize("which", ["dsn", "listen_dsn"])
async def test_a_worker_stops_on_a_role_the_server_does_not_know(
    database_url: str, schema: str, which: str
) -> None:
    """It retried for ever, logging a warning every few seconds."""
    async with leaseq.AsyncQueue(database_url, schema=schema) as queue:
        await queue.migrate()
    app = leaseq.App(schema=schema)

    @app.task("work")
    async def handler(job: leaseq.JobContext) -> None:
        pass

    refused = _with(database_url, user="leaseq_no_such_role")
    urls = {"dsn": database_url, "listen_dsn": database_url, which: refused}
    worker = leaseq.Worker(app, concurrency=1, poll_interval=0.1, maintenance=False, **urls)
    with pytest.raises(leaseq.InvalidDatabaseURL) as stopped:
        await asyncio.wait_for(worker.run(), AT_ONCE)
    assert "leaseq_no_such_role" in str(stopped.value)


def test_leaseq_worker_stops_with_one_error_line_on_an_unknown_database(
    database_url: str,
) -> None:
    url = _with(database_url, dbname="leaseq_no_such_database")
    result = subprocess.run(
        [sys.executable, "-m", "leaseq", "worker", "leaseq.demo.jobs:app"],
        env={"DATABASE_URL": url, "PATH": "/usr/bin:/bin", "NO_COLOR": "1"},
        capture_output=True,
        text=True,
        timeout=PATIENT,
        check=False,
    )
    assert result.returncode == 1, result
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, result.stderr
    assert errors[0].startswith("error: cannot connect to the database: ")
    assert 'database "leaseq_no_such_database" does not exist' in errors[0]
    assert "Traceback" not in result.stderr
