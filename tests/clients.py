"""The conformance suite's clients: ``leaseq.Queue`` as it is, and ``leaseq.AsyncQueue``
behind a small blocking adapter, so that one test body checks both.

:class:`BlockingQueue` owns a real :class:`~leaseq.AsyncQueue` and runs each of its
coroutines on a private event loop in a background thread
(``asyncio.run_coroutine_threadsafe``), the way an asyncio application would run
them. Its public methods are generated from ``AsyncQueue``'s (not written out, so
they cannot drift, and not inherited from ``Queue``, so no call can fall back on the
sync client); ``tests/test_clients.py`` checks that they are exactly ``Queue``'s.

Connections come in the client's flavour: the async leg's ``connection()`` (and the
``client_connect`` fixture) hand out a :class:`BlockingConnection`, a blocking facade
over a ``psycopg.AsyncConnection`` whose ``execute()`` returns the fetched rows. Passed
as ``conn=``, the adapter unwraps it, so ``AsyncQueue`` runs inside the caller's
transaction on its own (async) connection, as it would in an application.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import threading
from collections.abc import Callable, Coroutine, Iterator
from concurrent.futures import TimeoutError as FutureTimeout
from contextlib import AbstractAsyncContextManager, AbstractContextManager, contextmanager
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self, TypeAlias, TypeVar

import psycopg
import pytest

import leaseq
from leaseq.testing import aset_clock_offset
from leaseq.testing import set_clock_offset as set_sync_clock_offset

T = TypeVar("T")

#: Seconds one call of the async leg may take before the test fails (instead of
#: hanging): generous, the machine may be busy with other test runs.
CALL_TIMEOUT = 300.0

#: The legs of the conformance suite, as the ``client_kind`` ids read in ``pytest -v``.
CLIENT_KINDS = ("sync", "async")


class _LoopThread:
    """One event loop in a daemon thread, shared by every adapter of the process
    (an application's clients share its loop too). Started on first use."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None

    def loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                thread = threading.Thread(
                    target=loop.run_forever, name="leaseq-test-loop", daemon=True
                )
                thread.start()
                self._loop = loop
            return self._loop

    def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        """Run ``coroutine`` on the loop and wait for its result (or its exception)."""
        future = asyncio.run_coroutine_threadsafe(coroutine, self.loop())
        try:
            return future.result(CALL_TIMEOUT)
        except FutureTimeout:
            future.cancel()
            raise TimeoutError(f"an async client call took over {CALL_TIMEOUT} s") from None


_LOOP = _LoopThread()


# -- connections -----------------------------------------------------------------------


class FetchedCursor:
    """The answer of :meth:`BlockingConnection.execute`: its rows, already fetched (a
    statement without rows refuses a fetch, as psycopg's cursor does)."""

    def __init__(self, rows: list[Any] | None, rowcount: int, description: Any) -> None:
        self._rows = rows
        self.rowcount = rowcount
        self.description = description

    def _fetched(self) -> list[Any]:
        if self._rows is None:
            raise psycopg.ProgrammingError("the last operation didn't produce records")
        return self._rows

    def fetchone(self) -> Any:
        rows = self._fetched()
        return rows.pop(0) if rows else None

    def fetchall(self) -> list[Any]:
        rows = self._fetched()
        self._rows = []
        return rows

    def __iter__(self) -> Iterator[Any]:
        return iter(self.fetchall())


class BlockingConnection:
    """A blocking facade over a ``psycopg.AsyncConnection`` that lives on the loop:
    what the tests' raw SQL and transactions need of a ``psycopg.Connection``."""

    def __init__(self, conn: psycopg.AsyncConnection[Any]) -> None:
        self.raw = conn

    @classmethod
    def connect(cls, conninfo: str, **kwargs: Any) -> BlockingConnection:
        return cls(_LOOP.run(psycopg.AsyncConnection.connect(conninfo, **kwargs)))

    def execute(self, query: Any, params: Any = None, **kwargs: Any) -> FetchedCursor:
        async def execute() -> FetchedCursor:
            cursor = await self.raw.execute(query, params, **kwargs)
            rows = await cursor.fetchall() if cursor.description is not None else None
            return FetchedCursor(rows, cursor.rowcount, cursor.description)

        return _LOOP.run(execute())

    def transaction(
        self, savepoint_name: str | None = None, force_rollback: bool = False
    ) -> AbstractContextManager[psycopg.AsyncTransaction]:
        """``conn.transaction()``, entered and left on the loop: an exception in the
        block rolls it back, as with a sync connection."""
        return _blocking(self.raw.transaction(savepoint_name, force_rollback))

    @property
    def info(self) -> psycopg.ConnectionInfo:
        return self.raw.info

    @property
    def closed(self) -> bool:
        return self.raw.closed

    @property
    def autocommit(self) -> bool:
        return self.raw.autocommit

    def close(self) -> None:
        _LOOP.run(self.raw.close())

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        # psycopg's: commit (or roll back on an exception), then close.
        _LOOP.run(self.raw.__aexit__(exc_type, exc, tb))


@contextmanager
def _blocking(manager: AbstractAsyncContextManager[T]) -> Iterator[T]:
    """An async context manager entered and left on the loop, from this thread; the
    block's exception reaches its ``__aexit__`` (which may suppress it)."""
    value = _LOOP.run(manager.__aenter__())
    try:
        yield value
    except BaseException as exc:
        if not _LOOP.run(manager.__aexit__(type(exc), exc, exc.__traceback__)):
            raise
    else:
        _LOOP.run(manager.__aexit__(None, None, None))


def _to_async(value: Any) -> Any:
    """What the async client gets for an argument: a facade's own connection."""
    return value.raw if isinstance(value, BlockingConnection) else value


def _to_blocking(value: Any) -> Any:
    """What the test gets back: an async connection behind its blocking facade."""
    return BlockingConnection(value) if isinstance(value, psycopg.AsyncConnection) else value


# -- the client --------------------------------------------------------------------------


# To a type checker the adapter has Queue's interface; at run time it is built from
# AsyncQueue below and shares no code with Queue (tests/test_clients.py checks it).
if TYPE_CHECKING:
    _Interface = leaseq.Queue
else:
    _Interface = object


class BlockingQueue(_Interface):
    """``leaseq.AsyncQueue`` behind ``leaseq.Queue``'s interface; takes the same
    arguments (they go to the ``AsyncQueue`` it owns)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        async def construct() -> leaseq.AsyncQueue:
            return leaseq.AsyncQueue(*args, **kwargs)

        # Made on the loop its pool will live on.
        self.async_queue: leaseq.AsyncQueue = _LOOP.run(construct())

    def __enter__(self) -> Self:
        _LOOP.run(self.async_queue.__aenter__())
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        _LOOP.run(self.async_queue.__aexit__(exc_type, exc, tb))

    def __getattr__(self, name: str) -> Any:
        """The async queue's public data attributes (``dsn``); never a method (those
        are generated below) and nothing private."""
        if name.startswith("_") or name == "async_queue":
            raise AttributeError(name)
        value = getattr(self.async_queue, name)
        if callable(value):
            raise AttributeError(f"{name}: not a generated method of BlockingQueue")
        return value

    def __repr__(self) -> str:
        return f"<BlockingQueue over {self.async_queue!r}>"


def _blocking_method(name: str, member: Callable[..., Any]) -> Callable[..., Any]:
    """A sync method that calls the async queue's ``name`` on the loop: a coroutine
    function's result, or an async context manager as a sync one."""
    wrapped = getattr(member, "__wrapped__", None)
    if inspect.iscoroutinefunction(member):

        @functools.wraps(member)
        def call(self: BlockingQueue, *args: Any, **kwargs: Any) -> Any:
            method = getattr(self.async_queue, name)
            arguments = [_to_async(value) for value in args]
            options = {key: _to_async(value) for key, value in kwargs.items()}
            return _to_blocking(_LOOP.run(method(*arguments, **options)))

        return call
    if inspect.isasyncgenfunction(wrapped):

        @functools.wraps(member)
        @contextmanager
        def enter(self: BlockingQueue, *args: Any, **kwargs: Any) -> Iterator[Any]:
            method = getattr(self.async_queue, name)
            with _blocking(method(*args, **kwargs)) as value:
                yield _to_blocking(value)

        return enter
    raise TypeError(f"AsyncQueue.{name} is neither a coroutine nor an async context manager")


def public_methods(cls: type) -> dict[str, Callable[..., Any]]:
    return {
        name: member
        for name, member in inspect.getmembers(cls, inspect.isfunction)
        if not name.startswith("_")
    }


def public_properties(cls: type) -> dict[str, property]:
    return {
        name: member
        for name, member in inspect.getmembers(cls, lambda m: isinstance(m, property))
        if not name.startswith("_")
    }


def _forwarded(name: str, doc: str | None) -> property:
    def get(self: BlockingQueue) -> Any:
        return getattr(self.async_queue, name)

    return property(get, doc=doc)


def _build(cls: type[BlockingQueue]) -> None:
    for name, member in public_methods(leaseq.AsyncQueue).items():
        setattr(cls, name, _blocking_method(name, member))
    for name, prop in public_properties(leaseq.AsyncQueue).items():
        setattr(cls, name, _forwarded(name, prop.__doc__))


_build(BlockingQueue)

#: What a conformance test drives: the sync client, or the async one behind the adapter.
Client: TypeAlias = leaseq.Queue | BlockingQueue

#: A caller's own connection of a leg's flavour (``client_connect``), for ``conn=``.
ClientConnection: TypeAlias = psycopg.Connection[Any] | BlockingConnection
ClientConnect: TypeAlias = Callable[..., ClientConnection]

#: Each leg's client class: ``Queue``, or the adapter (same constructor arguments).
CLIENT_CLASSES: dict[str, type[Client]] = {"sync": leaseq.Queue, "async": BlockingQueue}


def set_clock_offset(client: Client, offset_seconds: float) -> None:
    """leaseq.testing's clock helper of the client's flavour: ``set_clock_offset`` for
    the sync client, ``aset_clock_offset`` (on the loop) for the async one."""
    if isinstance(client, BlockingQueue):
        _LOOP.run(aset_clock_offset(client.async_queue, offset_seconds))
    else:
        set_sync_clock_offset(client, offset_seconds)


def connect(kind: str, conninfo: str, **kwargs: Any) -> ClientConnection:
    """A caller's own connection of the leg's flavour, to pass as ``conn=``: a
    ``psycopg.Connection``, or a :class:`BlockingConnection` over an async one."""
    if kind == "sync":
        return psycopg.connect(conninfo, **kwargs)
    return BlockingConnection.connect(conninfo, **kwargs)


def sync_only(reason: str) -> pytest.MarkDecorator:
    """Run a conformance test on the sync leg only; the async leg is shown skipped
    with ``reason``."""
    return pytest.mark.parametrize(
        "client_kind",
        ["sync", pytest.param("async", marks=pytest.mark.skip(reason=f"sync only: {reason}"))],
        indirect=True,
    )
