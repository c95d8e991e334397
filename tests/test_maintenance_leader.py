"""The maintenance leader: one per schema, and every schema has one, whatever
its name."""

from __future__ import annotations

import asyncio
import uuid

import psycopg

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
