"""How a worker process counts SIGTERM/SIGINT: the first stops it gracefully, the next at once.

A child of ``leaseq worker --processes N`` often gets one stop signal twice: a
terminal's Ctrl-C and systemd's ``KillMode=control-group`` signal the whole
process group (or cgroup), and the supervisor forwards its own copy too (it must:
``kill <supervisor>`` reaches only the supervisor). Read as two signals, that
would skip the graceful stop. So in supervised children a repeat within
:data:`ECHO_WINDOW` seconds of the first is taken as that signal's echo. A
deliberate second signal comes later (a second Ctrl-C), and the supervisor
escalates its own second signal to SIGKILL anyway.
"""

from __future__ import annotations

import asyncio
import signal
import time
import weakref
from collections.abc import Callable
from typing import Any, ClassVar

#: Long enough for the supervisor's forwarded copy to arrive after the group's, even
#: on a loaded machine; short next to how soon anyone presses Ctrl-C a second time.
ECHO_WINDOW = 1.0


def treat_repeats_as_echoes(window: float = ECHO_WINDOW) -> None:
    """Called once by a supervised child, before its worker starts."""
    StopSignals.echo_window = window


class StopSignals:
    """Counts the stop signals a worker receives, echoes left out."""

    #: 0 outside supervised children: there, every signal counts.
    echo_window: ClassVar[float] = 0.0
    #: Whether any Worker of this process received a stop signal: a supervised
    #: child whose supervisor is gone stops as on a SIGTERM, unless stopping
    #: already (that SIGTERM would count as a second signal: jobs abandoned).
    any_received: ClassVar[bool] = False

    def __init__(self) -> None:
        self.count = 0
        self._first_at: float | None = None

    def received(self) -> int:
        """1 for the first signal, 2 and more for deliberate repeats, 0 for an echo."""
        StopSignals.any_received = True
        now = time.monotonic()
        if self._first_at is None:
            self._first_at = now
        elif now - self._first_at < self.echo_window:
            return 0
        self.count += 1
        return self.count


#: The stop handlers of the Workers running with ``install_signal_handlers`` on
#: each loop. asyncio keeps one handler per signal: a second Worker's replaced the
#: first's (one SIGTERM stopped one Worker), and the first to end removed it (the
#: next SIGTERM killed the process while the other held its jobs).
_HANDLERS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, list[Callable[[], None]]] = (
    weakref.WeakKeyDictionary()
)
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)

#: What handled each stop signal before the Workers' handlers on a loop: a
#: callback and its arguments the loop ran, else the process's own handler.
_Previous = tuple[Callable[..., object], tuple[object, ...]] | Any
#: Put back once the loop's last Worker ends: an application that embeds a
#: Worker kept, after it, the handlers that the Worker replaced while it ran
#: (its own graceful stop, say); they were gone, SIGTERM then killed it.
_PREVIOUS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[int, _Previous]] = (
    weakref.WeakKeyDictionary()
)


def add_stop_handler(loop: asyncio.AbstractEventLoop, handler: Callable[[], None]) -> None:
    """Call ``handler`` on SIGTERM and SIGINT, beside the other Workers' on ``loop``
    (in place of the application's own handlers of those signals, until the last
    Worker's is removed)."""
    handlers = _HANDLERS.setdefault(loop, [])
    if not handlers:
        _PREVIOUS[loop] = {signum: _current(loop, signum) for signum in STOP_SIGNALS}
        for signum in STOP_SIGNALS:
            loop.add_signal_handler(signum, _dispatch, handlers)
    handlers.append(handler)


def remove_stop_handler(loop: asyncio.AbstractEventLoop, handler: Callable[[], None]) -> None:
    """Undo :func:`add_stop_handler`; the loop's handlers go with the last one, and
    what handled the signals before the first comes back."""
    handlers = _HANDLERS.get(loop, [])
    if handler in handlers:
        handlers.remove(handler)
        if not handlers:
            previous = _PREVIOUS.pop(loop, {})
            for signum in STOP_SIGNALS:
                loop.remove_signal_handler(signum)
                _restore(loop, signum, previous.get(signum))


def _current(loop: asyncio.AbstractEventLoop, signum: int) -> _Previous:
    # asyncio keeps a loop's signal callbacks in a private dict (a Handle each):
    # the only way to see one. Without it, the process's own handler.
    handle = getattr(loop, "_signal_handlers", {}).get(signum)
    if handle is not None and not handle.cancelled():
        return (handle._callback, handle._args)
    return signal.getsignal(signum)


def _restore(loop: asyncio.AbstractEventLoop, signum: int, previous: _Previous) -> None:
    if isinstance(previous, tuple):
        callback, args = previous
        loop.add_signal_handler(signum, callback, *args)
    elif previous is not None:  # (None: not set from Python; the loop left the default)
        signal.signal(signum, previous)


def _dispatch(handlers: list[Callable[[], None]]) -> None:
    for handler in list(handlers):
        handler()
