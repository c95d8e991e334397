"""Through PgBouncer in transaction pooling (Debian's `pgbouncer`; skipped where
it is not installed): what the README says works there, does.

The pooler hands each transaction whatever server connection is free, and a
session's state stays with the server connection, for its next user: a LISTEN,
a prepared statement. With one server connection (`default_pool_size = 1`)
every client shares it, so a leak shows deterministically.
"""

from __future__ import annotations

import asyncio
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from click.testing import CliRunner
from psycopg.conninfo import conninfo_to_dict, make_conninfo

import leaseq
from leaseq._cli import cli

pytestmark = pytest.mark.skipif(
    shutil.which("pgbouncer") is None, reason="Debian's pgbouncer is not installed"
)

#: The README's options for a producer behind transaction pooling.
POOLED = {"connection_options": {"autocommit": True, "prepare_threshold": None}, "listen": False}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _pooler_user(server: dict[str, object]) -> str:
    """Whom pgbouncer runs as when the tests run as root (it refuses root): the
    owner of the server's socket folder (the embedded server's own user), or
    nobody for a server on TCP."""
    host = str(server.get("host") or "")
    if host.startswith("/"):
        return pwd.getpwuid(os.stat(host).st_uid).pw_name
    return "nobody"


@pytest.fixture
def pooler_url(database_url: str) -> Iterator[str]:
    """A PgBouncer of the test's own in transaction pooling, with one server
    connection, in front of the test's server; its URL."""
    server = conninfo_to_dict(database_url)
    target = " ".join(
        f"{key}={server[key]}" for key in ("host", "port", "user", "password") if server.get(key)
    )
    port = _free_port()
    folder = Path(tempfile.mkdtemp(prefix="leaseq-pgbouncer-"))
    folder.chmod(0o777)  # pgbouncer refuses root: it runs as nobody then
    config = folder / "pgbouncer.ini"
    config.write_text(
        f"[databases]\n* = {target}\n\n[pgbouncer]\n"
        f"listen_addr = 127.0.0.1\nlisten_port = {port}\nauth_type = any\n"
        "pool_mode = transaction\ndefault_pool_size = 1\nunix_socket_dir =\n"
        f"logfile = {folder / 'pgbouncer.log'}\n"
        "ignore_startup_parameters = options,extra_float_digits\n"
    )
    config.chmod(0o644)
    command = [
        "pgbouncer",
        *(["-u", _pooler_user(server)] if os.geteuid() == 0 else []),
        str(config),
    ]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = make_conninfo(
        "",
        host="127.0.0.1",
        port=port,
        user=server.get("user", "postgres"),
        dbname=server.get("dbname", "postgres"),
    )
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                with psycopg.connect(url, connect_timeout=2) as conn:
                    conn.execute("SELECT 1")
                break
            except psycopg.OperationalError:
                if process.poll() is not None or time.monotonic() > deadline:
                    log = folder / "pgbouncer.log"
                    pytest.fail(
                        f"pgbouncer did not start: {log.read_text() if log.exists() else ''}"
                    )
                time.sleep(0.1)
        yield url
    finally:
        process.terminate()
        process.wait(10)
        shutil.rmtree(folder, ignore_errors=True)


def _listening(pooler_url: str) -> list[str]:
    """The channels the pooler's (one) server connection listens to."""
    with psycopg.connect(pooler_url, autocommit=True, prepare_threshold=None) as conn:
        return [str(row[0]) for row in conn.execute("SELECT pg_listening_channels()")]


def test_wait_result_through_transaction_pooling_leaves_no_listen_behind(
    database_url: str, schema: str, pooler_url: str
) -> None:
    """wait_result LISTENed on a connection of its own; through the pooler that
    LISTEN stayed on a server connection, whose next users (anyone's) then got
    the notifications: PgBouncer logged "got packet 'A' from server when not
    linked". With ``listen=False`` it polls, and nothing stays behind."""
    with leaseq.Queue(database_url, schema=schema) as direct:
        direct.migrate()
        job_id = direct.enqueue("reports", {})
        (claim,) = direct.claim("reports")
        with leaseq.Queue(pooler_url, schema=schema, **POOLED) as producer:
            threading.Timer(0.3, direct.complete, (claim,), {"result": "ready"}).start()
            assert producer.wait_result(job_id, timeout=20, poll_interval=0.1) == "ready"
    assert _listening(pooler_url) == []


async def test_async_wait_result_through_transaction_pooling_leaves_no_listen_behind(
    database_url: str, schema: str, pooler_url: str
) -> None:
    async with leaseq.AsyncQueue(database_url, schema=schema) as direct:
        await direct.migrate()
        job_id = await direct.enqueue("reports", {})
        (claim,) = await direct.claim("reports")
        async with leaseq.AsyncQueue(pooler_url, schema=schema, **POOLED) as producer:
            waiting = producer.wait_result(job_id, timeout=20, poll_interval=0.1)
            task = asyncio.ensure_future(waiting)
            await asyncio.sleep(0.3)
            await direct.complete(claim, result="ready")
            assert await task == "ready"
    assert _listening(pooler_url) == []


def test_the_cli_works_through_transaction_pooling(
    database_url: str, schema: str, pooler_url: str
) -> None:
    """A one-shot command's connection prepared the statements it repeated (a
    prune of many batches), and through the pooler another client's prepared
    statement of the same name was on that server connection already: the
    prune stopped midway with `prepared statement "_pg3_0" ...`."""
    with leaseq.Queue(database_url, schema=schema) as direct:
        direct.migrate()
        direct.enqueue_many("reports", [{}] * 12)
        direct.complete_many(direct.claim("reports", limit=12))
    with psycopg.connect(pooler_url, autocommit=True, prepare_threshold=0) as other:
        other.execute("SELECT %s::int", (1,))  # prepared as _pg3_0 on the shared connection
    result = CliRunner().invoke(
        cli,
        [
            "prune",
            "--older-than",
            "0s",
            "--batch",
            "1",
            "--pause",
            "0",
            "--database-url",
            pooler_url,
            "--schema",
            schema,
        ],
    )
    assert result.exit_code == 0, result.output
    with psycopg.connect(database_url) as conn:
        left = conn.execute(f'SELECT count(*) FROM "{schema}".job').fetchone()
    assert left == (0,)  # all twelve removed
