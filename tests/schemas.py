"""The tests' schemas, migrated ahead and dropped behind by threads of each test process.

Migrating a fresh schema costs about 0.1 s of DDL and dropping it about 0.04 s:
done before and after each test, they were a quarter of the suite's time, while
the machine idled in the tests' waits. Here one thread migrates the next schema
while a test runs, and another drops the used ones after it. A test gets a
schema migrated ahead only when it asks for a migrated client (``queue``,
``aqueue``, ``client``), whose fixture would have migrated it first thing (and
still calls ``migrate()``, which then finds nothing to do). Whatever goes wrong
in a thread leaves the test to migrate a schema of its own, as before.
"""

from __future__ import annotations

import queue
import threading
import uuid

import psycopg

import leaseq

#: The fixtures that migrate the test's schema before the test runs.
MIGRATING_FIXTURES = frozenset({"queue", "aqueue", "client"})
#: How long a test waits for the schema being migrated ahead before it makes its own.
READY_WAIT = 30.0
#: A drop waits at most this long for a lock (a test's straggling connection),
#: then leaves that schema: the next drops must not queue up behind it.
DROP_LOCK_TIMEOUT = "20s"


def new_name() -> str:
    return f"t_{uuid.uuid4().hex[:16]}"


class Schemas:
    def __init__(self, database_url: str) -> None:
        self._url = database_url
        self._ready: queue.Queue[str] = queue.Queue(maxsize=1)
        self._used: queue.Queue[str | None] = queue.Queue()
        self._stopping = threading.Event()
        self._maker = threading.Thread(target=self._make_ahead, name="schemas-ahead", daemon=True)
        self._dropper = threading.Thread(
            target=self._drop_behind, name="schemas-behind", daemon=True
        )
        self._maker.start()
        self._dropper.start()

    def migrated(self) -> str | None:
        """A schema migrated ahead, or None: the caller migrates one of its own."""
        try:
            # (Not waited for once its thread is gone: every test would wait in vain.)
            return self._ready.get(timeout=READY_WAIT if self._maker.is_alive() else 0.01)
        except queue.Empty:
            return None

    def drop(self, name: str) -> None:
        self._used.put(name)

    def close(self) -> None:
        """Stop making schemas; drop every one made or used (waits for the drops)."""
        self._stopping.set()
        self._maker.join(READY_WAIT + 60)
        while not self._ready.empty():
            self._used.put(self._ready.get_nowait())
        self._used.put(None)
        self._dropper.join()

    def _make_ahead(self) -> None:
        while not self._stopping.is_set():
            name = new_name()
            try:
                with leaseq.Queue(self._url, schema=name, pool_size=1) as made:
                    made.migrate()
            except Exception:  # whatever it is, the test then migrates its own
                self._used.put(name)  # whatever of it was made
                self._stopping.wait(1.0)
                continue
            while True:
                try:
                    self._ready.put(name, timeout=0.2)
                    break
                except queue.Full:
                    if self._stopping.is_set():
                        self._used.put(name)
                        return

    def _drop_behind(self) -> None:
        conn: psycopg.Connection[tuple[object, ...]] | None = None
        try:
            while (name := self._used.get()) is not None:
                try:
                    if conn is None or conn.closed:
                        conn = psycopg.connect(self._url, autocommit=True)
                        conn.execute(f"SET lock_timeout = '{DROP_LOCK_TIMEOUT}'")
                    conn.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')
                except psycopg.Error:
                    if conn is not None:  # broken, or only the lock timed out: a new one
                        conn.close()
                    conn = None
        finally:
            if conn is not None:
                conn.close()
