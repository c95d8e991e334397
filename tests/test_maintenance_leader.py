"""The maintenance leader: one per schema, and every schema has one, whatever
its name."""

from __future__ import annotations

import asyncio
import re
import shutil
import subprocess
import time
import uuid

import psycopg
import pytest

import leaseq
from leaseq import JobStatus
from leaseq.testing import aset_clock_offset

# -- the maintenance leader: one per schema, every schema ---------------------------------


async def test_every_schema_gets_its_maintenance_leader_whatever_its_name(
    database_url: str,
) -> None:
    """The leader's lock was keyed by hashtext(schema): two schemas whose names
    hash alike (found in a second among 300,000 names) share one lock, so the
    second schema never has a leader: its exhausted jobs are never reaped, its
    retention never applied, for as long as the first one's leader runs."""
    prefix = f"t_{uuid.uuid4().hex[:8]}_"
    with psycopg.connect(database_url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT min(n), max(n) FROM (SELECT %(p)s || i AS n, hashtext(%(p)s || i) AS h"
            " FROM generate_series(1, 300000) AS i) AS s GROUP BY h HAVING count(*) = 2 LIMIT 1",
            {"p": prefix},
        ).fetchone()
    assert row is not None
    first, second = str(row[0]), str(row[1])
    tasks: list[asyncio.Task[None]] = []
    try:
        async with (
            leaseq.AsyncQueue(database_url, schema=first) as one,
            leaseq.AsyncQueue(database_url, schema=second) as other,
        ):
            await one.migrate()
            await other.migrate()
            (job_id,) = await other.enqueue_many("q", [{}], max_attempts=1)
            assert len(await other.claim("q", lease=5)) == 1
            await aset_clock_offset(other, 10)
            leader = leaseq.Maintenance(one, interval=0.05, retention=False, vacuum=False)
            tasks.append(asyncio.create_task(leader.run()))
            async with asyncio.timeout(10):
                while not leader.leading:
                    await asyncio.sleep(0.02)
            reaper = leaseq.Maintenance(other, interval=0.05, retention=False, vacuum=False)
            tasks.append(asyncio.create_task(reaper.run()))
            try:
                async with asyncio.timeout(5):
                    while reaper.reaped < 1:
                        await asyncio.sleep(0.05)
            except TimeoutError:
                pass
            assert reaper.leading, f"schema {second} has no maintenance leader"
            assert (await other.get(job_id)).status is JobStatus.FAILED
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        with psycopg.connect(database_url, autocommit=True) as conn:
            for name in (first, second):
                conn.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')


# -- a leader whose host vanished ------------------------------------------------------


def _server_keepalive_seconds(server_port: int, client_port: int) -> float | None:
    """When the server's kernel next probes the peer of its socket to client_port
    (`ss`'s keepalive timer of the server's end), or None where it is not seen
    (no `ss`, a server on another host, a statement's answer unacknowledged)."""
    ss = shutil.which("ss")
    if ss is None:
        return None
    output = subprocess.run(
        [
            ss,
            "-tnoH",
            "state",
            "established",
            f"( sport = :{server_port} and dport = :{client_port} )",
        ],
        capture_output=True,
        text=True,
        check=False,
    ).stdout
    timer = re.search(r"timer:\(keepalive,([^,]+),", output)
    if timer is None:
        return None
    units = {"ms": 0.001, "sec": 1.0, "min": 60.0, "h": 3600.0}
    return sum(float(n) * units[u] for n, u in re.findall(r"([\d.]+)(ms|sec|min|h)", timer[1]))


async def test_the_server_lets_go_of_a_vanished_leaders_lock_within_a_minute(
    aqueue: leaseq.AsyncQueue, database_url: str, schema: str
) -> None:
    """The leader's lock lives as long as its session on the server. A leader whose
    host vanished (power lost, a network cut: no FIN, no RST) leaves that session
    idle on the server, which learns of the dead peer only from its own TCP
    keepalives: with the server's defaults (the OS's, 2 hours before a first
    probe) no other worker could lead for over 2 hours, and nothing was reaped,
    nor retention applied. What must hold: the server starts probing the leader's
    silent peer within a minute."""
    # A long interval: the leader's session idles between rounds, as it mostly does
    # (while a statement is unanswered the socket's timer is the retransmission's).
    leader = leaseq.Maintenance(aqueue, interval=60, retention=False, vacuum=False)
    task = asyncio.create_task(leader.run())
    try:
        async with asyncio.timeout(10):
            while not leader.leading:
                await asyncio.sleep(0.02)
        with psycopg.connect(database_url, autocommit=True) as conn:
            row = conn.execute(
                "SELECT a.client_addr IS NOT NULL, a.client_port, inet_server_port()"
                " FROM pg_locks AS l JOIN pg_stat_activity AS a USING (pid)"
                " WHERE l.locktype = 'advisory' AND l.granted"
                " AND l.classid::integer = hashtext('leaseq.maintenance.schema_oid')"
                " AND l.objid = (SELECT oid FROM pg_namespace WHERE nspname = %s)",
                (schema,),
            ).fetchone()
        assert row is not None, "the leader holds no lock"
        over_tcp, client_port, server_port = row
        if not over_tcp:
            pytest.skip("the server is reached through a Unix socket: no TCP keepalives")
        seconds = None
        deadline = time.monotonic() + 10
        while seconds is None and shutil.which("ss") and time.monotonic() < deadline:
            seconds = _server_keepalive_seconds(server_port, client_port)
            await asyncio.sleep(0.1)
        if seconds is None:
            pytest.skip("the server's socket cannot be seen from here (no ss, another host)")
        assert seconds <= 60, f"the server first probes a silent leader after {seconds:.0f} s"
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


_HOLDERS = (
    "SELECT l.pid FROM pg_locks AS l WHERE l.locktype = 'advisory' AND l.granted"
    " AND l.classid::integer = hashtext('leaseq.maintenance.schema_oid')"
    " AND l.objid = (SELECT oid FROM pg_namespace WHERE nspname = %s)"
)


async def test_a_leader_whose_session_is_killed_stops_leading_and_one_other_leads(
    aqueue: leaseq.AsyncQueue, database_url: str, schema: str
) -> None:
    """pg_terminate_backend of the leader's session (its process lives on): the
    lock goes with the session, one leader leads after it (never two holders),
    and it reaps."""
    keepers = [
        leaseq.Maintenance(aqueue, interval=0.05, retention=False, vacuum=False) for _ in range(3)
    ]
    tasks = [asyncio.create_task(k.run()) for k in keepers]
    try:
        with psycopg.connect(database_url, autocommit=True) as conn:
            deadline = time.monotonic() + 10
            while not (holders := conn.execute(_HOLDERS, (schema,)).fetchall()):
                assert time.monotonic() < deadline, "no leader"
                await asyncio.sleep(0.02)
            ((first,),) = holders
            conn.execute("SELECT pg_terminate_backend(%s)", (first,))
            deadline = time.monotonic() + 10
            while [row[0] for row in conn.execute(_HOLDERS, (schema,)).fetchall()] in ([], [first]):
                assert time.monotonic() < deadline, "no leader after the first one's session ended"
                await asyncio.sleep(0.02)
            for _ in range(20):
                assert len(conn.execute(_HOLDERS, (schema,)).fetchall()) == 1
                await asyncio.sleep(0.02)
        (job_id,) = await aqueue.enqueue_many("q", [{}], max_attempts=1)
        await aqueue.claim("q", lease=1)
        await aset_clock_offset(aqueue, 5)
        deadline = time.monotonic() + 10
        while sum(k.reaped for k in keepers) < 1 and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert (await aqueue.get(job_id)).status is JobStatus.FAILED
        assert sum(k.leading for k in keepers) == 1
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
