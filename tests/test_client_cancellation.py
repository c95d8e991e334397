"""What a client call leaves behind when it is cut short: a cancellation, a timeout,
a failure of a later statement of the call."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import psycopg
import pytest

import leaseq

from .clients import Client


def _stalled_key_repair(conn: psycopg.Connection[Any], schema: str, queue: str) -> None:
    """A due repair note of ordering key "k" (of one queued job) whose waiting head
    another transaction holds locked (``conn``'s, left open): settling the key
    waits for that lock. The note and the waiting head are what a producer in
    flight at a settle leaves."""
    conn.execute(f"UPDATE {schema}.job SET blocked = true WHERE ordering_key = 'k'")
    conn.execute(
        f"INSERT INTO {schema}.key_repair (queue, ordering_key, next_check)"
        " VALUES (%s, 'k', now() - interval '1 second')",
        (queue,),
    )
    conn.commit()
    conn.execute(f"SELECT 1 FROM {schema}.job WHERE ordering_key = 'k' FOR UPDATE")


def _running(conn: psycopg.Connection[Any], schema: str) -> list[int]:
    rows = conn.execute(f"SELECT job_id FROM {schema}.job WHERE status = 'running'").fetchall()
    return [row[0] for row in rows]


async def test_a_claim_cut_short_after_its_jobs_were_claimed_leaves_none_running_unseen(
    database_url: str, schema: str, connect: Callable[..., psycopg.Connection[Any]]
) -> None:
    async with leaseq.AsyncQueue(database_url, schema=schema) as q:
        await q.migrate()
        job_id = await q.enqueue("q", {"n": 1})
        await q.enqueue("q", {"n": 2}, key="k", seq=1)
        locker = connect()
        _stalled_key_repair(locker, schema, "q")
        got: leaseq.Claims | None = None
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(2):
                got = await q.claim("q", limit=5)
        locker.rollback()
        assert got is None
        # Must never happen: the job claimed (running, leased) while the caller
        # holds no claim of it and nothing gives it back before its lease ends.
        assert job_id not in _running(connect(autocommit=True), schema)
        (again,) = [c for c in await q.claim("q", limit=5) if c.job_id == job_id]
        assert again.attempts == 1


def test_a_claim_whose_later_statement_fails_still_hands_over_what_it_claimed(
    client_class: type[Client],
    database_url: str,
    schema: str,
    connect: Callable[..., psycopg.Connection[Any]],
) -> None:
    """The repair of keys a claim does after its claim times out: the jobs it
    claimed are the caller's all the same (the notes stay due for the next claim)."""
    with client_class(database_url, schema=schema, statement_timeout=0.5) as q:
        q.migrate()
        job_id = q.enqueue("q", {"n": 1})
        q.enqueue("q", {"n": 2}, key="k", seq=1)
        locker = connect()
        _stalled_key_repair(locker, schema, "q")
        try:
            claims = q.claim("q", limit=5)
        finally:
            locker.rollback()
        assert [c.job_id for c in claims] == [job_id]
        assert _running(connect(autocommit=True), schema) == [job_id]


async def test_a_claim_cancelled_as_its_answer_arrives_leaves_none_running_unseen(
    database_url: str, schema: str, connect: Callable[..., psycopg.Connection[Any]]
) -> None:
    observer = connect(autocommit=True)
    async with leaseq.AsyncQueue(database_url, schema=schema) as q:
        await q.migrate()
        job_id = await q.enqueue("q", {"n": 1})
        await q.stats("q")  # the pool is open: the claim's first steps need no connection
        claiming = asyncio.ensure_future(q.claim("q", limit=5))
        # Step the claim one turn of the loop at a time, and between turns, with
        # the loop held (so that the claim cannot read an answer), look whether
        # its statement has committed. Once it has, the task is cancelled before
        # it reads the answer: the server claimed, the caller is told nothing.
        for _ in range(1000):
            await asyncio.sleep(0)
            if claiming.done():
                pytest.fail("the claim read its answer within one turn of the loop")
            time.sleep(0.002)
            if _running(observer, schema):
                break
        else:
            pytest.fail("the claim never committed")
        claiming.cancel()
        with pytest.raises(asyncio.CancelledError):
            await claiming
        assert job_id not in _running(observer, schema)
        # Given back as a release is: claimable at once, the attempt not counted.
        (again,) = await q.claim("q")
        assert (again.job_id, again.attempts) == (job_id, 1)
