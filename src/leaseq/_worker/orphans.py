"""Noticing, in a spawned child, that the process that started it is gone.

A parent killed outright (SIGKILL, the OOM killer) can neither stop nor tell its
children: they must notice by themselves. Two signs, either enough:

* spawn's own pipe (``multiprocessing.parent_process().sentinel``): the child
  holds its read end from its very start (inherited through the exec), and only
  the parent holds its write end, so it reads end-of-file once the parent is
  gone, however early that happened. A parent pid polled with ``os.getppid()``
  from the child's own code missed a parent that died during the child's
  start-up (the pid it then read was the adopting process's, for ever);
* the parent's pid, as the parent itself recorded it at the spawn, against
  ``os.getppid()``: a process that forked from the parent without an exec
  (a handler's ``os.fork()``) holds the pipe's write end too, and would keep the
  end-of-file away. The comparison cannot be fooled by pid reuse: the adopting
  process (init, a subreaper) was alive beside the dead parent, so its pid is
  another.
"""

from __future__ import annotations

import multiprocessing
import os
import threading
from collections.abc import Callable
from multiprocessing.connection import wait

#: How often the parent's pid is compared (the pipe's end-of-file wakes at once).
_PID_CHECK = 0.5


def when_parent_gone(callback: Callable[[], None], name: str) -> None:
    """Call ``callback`` once, in a daemon thread, when this process's spawning
    parent is gone. Nothing in a process that multiprocessing did not spawn."""
    parent = multiprocessing.parent_process()
    if parent is None or parent.pid is None:
        return
    threading.Thread(
        target=_watch, args=(parent.sentinel, parent.pid, callback), name=name, daemon=True
    ).start()


def _watch(sentinel: int, parent_pid: int, callback: Callable[[], None]) -> None:
    while not wait([sentinel], timeout=_PID_CHECK) and os.getppid() == parent_pid:
        pass
    callback()
