"""The sync client's pool: :class:`Database`, opened on first use, dropped and
opened again by the rules of :mod:`.pool_rules`; the operations run on its
connections (:mod:`.execution`), the driver's errors typed (:mod:`.errors`)."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any, TypeVar

import psycopg
from psycopg_pool import ConnectionPool, PoolClosed, PoolTimeout

from .._statement import Operation, Plan, Rows, Statement, Steps
from . import forks
from .errors import malformed_dsn, read_only_server, translated_errors
from .execution import Connection, callers, drive, execute, retryable
from .listening import SharedThreadListener, sleeping
from .options import CONNECTION_OPTIONS, under_the_url
from .pool_rules import (
    READY_SECONDS,
    ConnectWatch,
    OpenFailures,
    attempt_timeout,
    closed_by_server,
    failing,
    pool_settings,
    reset_session,
    reset_state,
)

T = TypeVar("T")


class Database:
    """A lazily opened pool of autocommit connections (sync).

    The pool is made and opened by its first user, under a lock: callers that
    arrive meanwhile wait for it, and none sees a pool that is not open yet. A
    pool that could not open (psycopg closes it) or that :meth:`close` closed is
    dropped, and the next use opens a new one: a psycopg pool cannot reopen. So is
    a pool that lends no connection in ``pool_rules.POOL_ATTEMPT_SECONDS`` while none of its
    connections is lent and its connection attempts fail (the database was away):
    its own retries would come later and later. A caller waits up to
    ``open_timeout`` in all for its connection.
    """

    def __init__(
        self,
        dsn: str,
        *,
        min_size: int = 1,
        max_size: int = 10,
        options: dict[str, Any] | None = None,
        open_timeout: float = 30.0,
        listen: bool = True,
    ) -> None:
        self.dsn = dsn
        self.open_timeout = open_timeout
        #: Whether :meth:`notified` LISTENs (not behind a transaction pooler).
        self._listen = listen
        #: One LISTEN connection per statement, shared by every waiting thread.
        self._listeners: dict[str, SharedThreadListener] = {}
        self._options = under_the_url(dsn, options or CONNECTION_OPTIONS)
        self._settings = pool_settings(dsn, min_size, max_size, self._options, open_timeout)
        #: The open pool; None until the first use, and again after a close.
        self._pool: ConnectionPool | None = None
        self._lock = threading.Lock()
        self._failures = OpenFailures()
        #: How many of the pool's connections are lent now (under ``_lent_lock``).
        self._lent = 0
        self._lent_lock = threading.RLock()
        forks.track(self)

    def forget_after_fork(self) -> object:
        """In a forked child: the parent's pool, locks and tasks are not ours (see forks)."""
        kept = (self._pool, self._lock, self._lent_lock, self._listeners)
        self._pool = None
        # The parent's listener thread did not come along (and may have held its lock).
        self._listeners = {}
        self._lock = threading.Lock()
        self._failures = OpenFailures()
        self._lent = 0
        self._lent_lock = threading.RLock()
        return kept

    def _open_pool(self, deadline: float) -> ConnectionPool:
        pool = self._pool
        if pool is None:
            seen = self._failures.count
            with self._lock:
                pool = self._pool
                if pool is None:
                    self._failures.raise_if_since(seen)
                    pool = self._new_pool(deadline)
                    self._pool = pool  # only once open: callers without the lock use it
        return pool

    def _new_pool(self, deadline: float) -> ConnectionPool:
        """An open pool, new pools tried until ``deadline``."""
        if (malformed := malformed_dsn(self.dsn)) is not None:  # no pool can connect with it
            raise self._failures.record(malformed)
        slow = False  # a connection slow to succeed (not failing) gets all the time
        while True:
            watch = ConnectWatch()
            pool = ConnectionPool(
                **self._settings,
                connection_class=watch.connection_class(),
            )
            try:
                window = attempt_timeout(deadline, slow)
                started = time.monotonic()
                pool.open(wait=False)
                if watch.wait(window):
                    if watch.refusal is not None:  # no retry can connect: said at once
                        raise self._failures.record(watch.refusal)
                    pool.wait(max(window - (time.monotonic() - started), READY_SECONDS))
                    return pool
                # Not waited for: an attempt still in flight ends at its connect_timeout.
                self._close_in_background(pool)
            except PoolTimeout:  # the pool closed itself
                pass
            except BaseException:
                pool.close()
                raise
            slow = watch.failure is None  # slow to answer, not failing: all the time next
            if time.monotonic() >= deadline:
                raise self._failures.record(watch.unavailable(self.open_timeout)) from None

    @contextmanager
    def connection(self, reset: Statement | None = None) -> Iterator[Connection]:
        """A connection of the pool (autocommit), back in the pool afterwards; with
        ``reset`` (a caller's own SQL ran on it), its session reset first."""
        with translated_errors():
            deadline = time.monotonic() + self.open_timeout
            while True:
                pool = self._open_pool(deadline)
                try:
                    conn = pool.getconn(attempt_timeout(deadline, self._lent > 0))
                except PoolClosed:  # closed by close() once this caller had it: a new one
                    self._forget(pool)
                    continue
                except PoolTimeout:
                    if time.monotonic() >= deadline:
                        raise
                    self._drop_if_failing(pool)
                    continue
                if not closed_by_server(conn):
                    # As the pool made it (autocommit, writable), whatever its last
                    # user set: here, not as the pool's reset=, which psycopg_pool
                    # runs in a worker thread, the connection away meanwhile (+100 us
                    # an enqueue, measured).
                    reset_state(conn, self._options)
                    break
                pool.putconn(conn)  # discarded: the pool makes another
            with self._lent_lock:
                self._lent += 1
            try:
                with conn:  # as psycopg's pool.connection(): ends a transaction left open
                    yield conn
            except Exception as exc:
                if (read_only := read_only_server(exc)) is None:
                    raise
                # Every connection of the pool reaches the read-only server: the
                # next call opens a new pool, which may reach one that writes.
                conn.close()
                self._drop(pool)
                raise read_only from exc
            finally:
                with self._lent_lock:
                    self._lent -= 1
                try:
                    if reset is not None:
                        reset_session(conn, reset.sql)
                finally:
                    pool.putconn(conn)

    def _forget(self, pool: ConnectionPool) -> None:
        with self._lent_lock:
            if self._pool is pool:
                self._pool = None

    def _drop_if_failing(self, pool: ConnectionPool) -> None:
        """Drop ``pool`` if none of its connections is lent (it has none) and its
        attempts fail; closed in the background, its retries with it."""
        with self._lent_lock:  # (reentrant: _drop takes it too)
            if self._lent or not failing(pool):
                return  # busy, or slow to connect: waited for
            self._drop(pool)

    def _drop(self, pool: ConnectionPool) -> None:
        """The next use opens a new pool; ``pool`` is closed in the background (a
        connection lent from it is closed when given back)."""
        with self._lent_lock:
            if self._pool is not pool:
                return  # dropped already
            self._pool = None
        self._close_in_background(pool)

    def _close_in_background(self, pool: ConnectionPool) -> None:
        """Close ``pool`` in the background (a thread; a task that close() awaits):
        no caller waits for its attempt in flight (psycopg waits up to 5 s for it)."""
        threading.Thread(target=pool.close, name="leaseq-pool-close", daemon=True).start()

    def run(self, operation: Operation[T], conn: Connection | None = None) -> T:
        """Run one operation on ``conn`` (the caller's), else on a pool connection.
        One that committed there although its caller was interrupted meanwhile (a
        task cancelled, Ctrl-C) is undone (``Operation.undo``) before the
        interruption propagates."""
        if conn is not None:
            return execute(callers(conn, psycopg.Connection), operation, theirs=True)
        attempt = 0
        answered: list[Rows] = []
        try:
            while True:
                with self.connection() as own:
                    try:
                        return execute(own, operation, answered)
                    except Exception as exc:
                        if not retryable(operation, exc, attempt):
                            raise
                attempt += 1
        except BaseException:
            if answered:
                self._undo(operation, answered)
            raise

    def _undo(self, operation: Operation[T], answered: list[Rows]) -> None:
        """Undo ``operation``, which ``answered`` although its caller was interrupted
        (asyncio: within UNDO_SECONDS); a failure is left to what it undoes (a
        claim's leases end): the interruption is what propagates."""
        if operation.undo is None:
            return
        with contextlib.suppress(Exception):
            undo = operation.undo(operation.decode(answered))
            if undo is not None:
                self.run(undo)

    def run_steps(self, steps: Steps[T], conn: Connection | None = None) -> T:
        """Run each operation the steps yield, sending back its result. An error is
        raised into the steps, which may act on it (an interrupted claim gives back
        what it took: asyncio, each operation within UNDO_SECONDS)."""
        callers(conn, psycopg.Connection)
        try:
            operation = next(steps)
            while True:
                try:
                    result = self.run(operation, None if operation.detached else conn)
                except BaseException as exc:
                    operation = steps.throw(exc)
                    continue
                operation = steps.send(result)
        except StopIteration as done:
            value: T = done.value
            return value
        finally:
            steps.close()

    def drive(self, plan: Plan) -> list[int]:
        """Run a statement plan (migrations) in one transaction."""
        with self.connection() as conn:
            return drive(conn, plan)

    def notified(self, statement: Statement) -> AbstractContextManager[Callable[[float], None]]:
        """``wait(seconds)``, cut short by a notification on what ``statement``
        LISTENs to (:mod:`.listening`); without ``listen``, a plain sleep."""
        if not self._listen:
            return sleeping()
        with self._lock:
            shared = self._listeners.get(statement.sql)
            if shared is None:
                shared = self._listeners[statement.sql] = SharedThreadListener(
                    self.dsn, self._options, statement
                )
        return shared.waiting()

    def close(self) -> None:
        """Close the pool (a new one opens on the next use)."""
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.close()
