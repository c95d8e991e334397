"""The child's side of a process handler (:mod:`.processes` is the worker's).

A child is spawned by :class:`.processes.ProcessPool` and runs
:func:`child_main`: it takes handler calls from its pipe one at a time, runs
each with a :class:`JobContext` of its own, and sends back the answer. What
crosses the pipe must pickle, so an exception that does not survive pickling is
rebuilt as its own class (:func:`_sendable`), and a result that cannot be sent
fails the attempt with :class:`InvalidResult`.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import os
import pickle
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable
from multiprocessing.connection import Connection as Pipe
from typing import Any

from .. import _tracing
from .._async_client import WORKER_CONNECTIONS, AsyncQueue
from .._errors import InvalidResult
from .._sync_client import Queue
from .._types import Claim
from .context import JobContext
from .orphans import when_parent_gone

#: A byte shared with a child (``multiprocessing.Value("b", lock=False)``): 1 once
#: its attempt is lost. One writer (the worker), one reader: no lock needed.
Flag = Any

#: Seconds a process handler has to return once told (``job.lost``) before it is
#: killed by its worker, or leaves by itself when its worker is gone.
KILL_AFTER = 5.0
#: How often a waiting thread (the worker's, the child's watcher) looks at a flag.
POLL = 0.05
#: What a terminal's Ctrl-C and a service manager's stop send the process group.
STOP_SIGNALS = frozenset({signal.SIGINT, signal.SIGTERM})


class ProcessHandlerError(Exception):
    """A handler's exception that could not be sent back from its process as itself."""


def child_main(
    pipe: Pipe, lost: Flag, completed: Flag, leads_group: Flag, *, dsn: str, schema: str
) -> None:
    """A child's life: handler calls, one at a time, until told to leave."""
    # Ctrl-C in a terminal (SIGINT) and a service manager's stop (SIGTERM) reach
    # the whole process group. The worker decides how its jobs end (finished
    # within its grace, else released, then this process told and killed): a
    # child must neither die of the signal mid-job (its job failed) nor send it
    # back as the handler's KeyboardInterrupt. The worker ends its children
    # itself (ProcessPool.close), or they leave when its end closes their pipe.
    for signum in STOP_SIGNALS:
        signal.signal(signum, signal.SIG_IGN)  # (discards one held back since the spawn)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
    # A process group of its own, which the processes its handlers start join: a
    # child killed (its timeout, the worker's stop) or dead under its handler is
    # ended with them (ProcessPool), rather than leave them orphaned beside the
    # job's next attempt. (Nothing is lost by leaving the terminal's group: its
    # Ctrl-C was ignored here, and the worker ends its children itself.)
    os.setpgrp()
    leads_group.value = 1
    when_parent_gone(functools.partial(_leave_with_the_worker, lost), name="leaseq-orphan-watch")
    # The worker's session settings (keepalives, a TCP user timeout, an
    # idle_in_transaction_session_timeout), as on its handler threads' connections:
    # a transaction left open here (the host cut off from the database) must not
    # hold the job's row, and the handler's, for as long as the server's keepalive.
    sync_queue = Queue(dsn, schema=schema, pool_size=2, connection_options=WORKER_CONNECTIONS)
    async_queue = AsyncQueue(dsn, schema=schema, pool_size=1, connection_options=WORKER_CONNECTIONS)
    try:
        while (work := pipe.recv()) is not None:
            module, qualname, claim, trace_context, max_result_bytes = work
            answer: tuple[str, Any, bool, Any]
            try:
                handler = _resolve(module, qualname)
            except Exception as exc:  # an import error of the user's module, say
                answer = ("error", _sendable(exc), False, None)
            else:
                context = _ChildJobContext(
                    claim, sync_queue, async_queue, completed, max_result_bytes
                )
                with _tracing.continued(trace_context):
                    answer = _run_one(handler, context, lost)
            pipe.send(_packed(answer))
    except (EOFError, BrokenPipeError):
        pass  # the worker went away (an answer to it has nowhere to go)
    finally:
        sync_queue.close()


#: What crosses the pipe: the answer's kind ("ok" or "error"), its value pickled,
#: whether its job.transaction() committed the completion, and its result pickled.
#: Pickled here, apart, so that the worker knows the kind of an answer whose value
#: it cannot unpickle (see ``unpacked``).
Packed = tuple[str, bytes, bool, bytes]


def _packed(answer: tuple[str, Any, bool, Any]) -> Packed:
    kind, value, completed, result = answer
    try:
        return (kind, pickle.dumps(value), completed, pickle.dumps(result))
    except Exception as exc:
        # What no attempt can send either (a lambda, a structure nested past the
        # recursion limit, a value whose pickling raises): the result cannot be
        # stored, fail at once.
        unsent = InvalidResult(
            f"result cannot be stored: it cannot be sent back from the handler's "
            f"process ({type(exc).__name__}: {exc})"
        )
        return ("error", pickle.dumps(unsent), completed, pickle.dumps(None))


def unpacked(packed: Packed) -> tuple[str, Any, bool, Any]:
    """The answer, in the worker. A value that pickled in the child may still not
    unpickle here (its class's constructor refuses what pickle passes it): a
    result so is one that cannot be stored (InvalidResult, as from a thread);
    an error so is reported by its text."""
    kind, value_bytes, completed, result_bytes = packed
    try:
        value = pickle.loads(value_bytes)
    except Exception as exc:
        why = f"({type(exc).__name__}: {exc})"
        if kind == "ok":
            value = InvalidResult(
                f"result cannot be stored: it cannot be received from the handler's process {why}"
            )
        else:
            value = ProcessHandlerError(f"the handler's error could not be received {why}")
        kind = "error"
    try:
        result = pickle.loads(result_bytes)
    except Exception:
        result = None  # (stored by its committed completion all the same)
    return kind, value, completed, result


def _leave_with_the_worker(lost: Flag) -> None:
    """A worker killed outright (SIGKILL, the OOM killer) cannot tell its children
    nor kill them, and a busy child never reads the pipe that would say so: it ran
    on, orphaned, beside the job's next attempt elsewhere. Once the worker is gone
    (:mod:`.orphans`: noticed even when it died while this process was starting)
    the handler is told, as the worker would have told it, and the process leaves
    ``KILL_AFTER`` seconds later, ending the processes its handler started with it
    (its process group)."""
    lost.value = 1  # the handler's job.lost (its _watch)
    time.sleep(KILL_AFTER)
    if os.getpgrp() == os.getpid():  # (never the worker's group: its siblings are in it)
        os.killpg(os.getpid(), signal.SIGKILL)  # what its handler started, and itself
    os._exit(1)


class _ChildJobContext(JobContext):
    """The handler's JobContext in a child: a completion its job.transaction()
    committed is told to the worker at once, through a shared flag."""

    def __init__(
        self,
        claim: Claim,
        sync_queue: Queue,
        async_queue: AsyncQueue,
        completed: Flag,
        max_result_bytes: int,
    ) -> None:
        super().__init__(claim, sync_queue, async_queue, max_result_bytes)
        self._completed_flag = completed

    def mark_completed(self) -> None:
        super().mark_completed()
        self._completed_flag.value = 1


def _run_one(
    handler: Callable[[JobContext], Any], context: JobContext, lost: Flag
) -> tuple[str, Any, bool, Any]:
    """Call the handler; its answer: ok or error, and whether (and with what
    result) its ``job.transaction()`` completed the job."""
    watching = threading.Event()
    watcher = threading.Thread(target=_watch, args=(lost, context, watching), daemon=True)
    watcher.start()
    try:
        returned = handler(context)
        answer: tuple[str, Any, bool, Any] = (
            "ok",
            returned,
            context.completed,
            context.outcome_result,  # (when completed: the result its transaction stored)
        )
    except BaseException as exc:
        answer = ("error", _sendable(exc), context.completed, context.outcome_result)
    finally:
        watching.set()
        watcher.join()
    return answer


def _watch(lost: Flag, context: JobContext, done: threading.Event) -> None:
    """Turn the worker's flag into ``job.lost``, a real Event the handler can wait on."""
    while not done.wait(POLL):
        if lost.value:
            context.mark_lost("told by the worker")
            return


def _resolve(module: str, qualname: str) -> Callable[[JobContext], Any]:
    # A handler of a script run as __main__ lives in the child's __mp_main__.
    if module == "__main__":
        module = "__mp_main__"
    target: Any = sys.modules.get(module) or importlib.import_module(module)
    for part in qualname.split("."):
        target = getattr(target, part)
    handler: Callable[[JobContext], Any] = target
    return handler


def _sendable(error: BaseException) -> BaseException:
    """The handler's exception itself if it survives pickling; else the same class
    rebuilt without its constructor (so that a PermanentError, or an error the
    task fails on, keeps its meaning); else its text."""
    try:
        pickle.loads(pickle.dumps(error))
    except Exception:
        pass
    else:
        return error
    for keep_attributes in (True, False):  # (an attribute may not pickle either)
        rebuilt = _Rebuilt(error, f"{error}", keep_attributes)
        try:
            pickle.loads(pickle.dumps(rebuilt))
        except Exception:
            continue
        return rebuilt  # type: ignore[return-value]  # (unpickled as the error's class)
    text = "".join(traceback.format_exception(error)).rstrip()
    return ProcessHandlerError(f"{type(error).__qualname__}: {error}\n{text}")


class _Rebuilt:
    """Pickles as an instance of the error's class made without calling its
    ``__init__`` (whose arguments pickle does not keep: it calls the class with
    ``args``, the message, which a constructor of other arguments refuses): the
    same ``args`` and attributes, and the message as the child saw it."""

    def __init__(self, error: BaseException, message: str, keep_attributes: bool) -> None:
        self.error = error
        self.message = message
        self.keep_attributes = keep_attributes

    def __reduce__(self) -> tuple[Any, ...]:
        state = dict(getattr(self.error, "__dict__", {})) if self.keep_attributes else {}
        return (_rebuild, (type(self.error), self.error.args, state, self.message))


def _rebuild(
    cls: type[BaseException], args: tuple[Any, ...], state: dict[str, Any], message: str
) -> BaseException:
    error = cls.__new__(cls, *args)
    error.args = args if args else (message,)
    with contextlib.suppress(Exception):
        error.__dict__.update(state)
    return error
