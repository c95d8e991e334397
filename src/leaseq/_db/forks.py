"""Pools across ``os.fork()``: a child forgets its parent's pools, never closes them.

A pool opened before a fork (gunicorn ``--preload``, multiprocessing's fork start
method) is the parent's: its connections' sockets are shared with the parent's
sessions, and its worker threads did not come along. A child that used it mixed
its answers with the parent's (an enqueue returned another process's job id) or
hung; one that closed it ended the parent's sessions. After a fork, every
:class:`~leaseq._db.database.Database` and
:class:`~leaseq._db.async_database.AsyncDatabase` of the child starts afresh: a
pool of its own on its first use. The parent's pools stay referenced in the
child and are never finalized there (psycopg leaves a connection made by another
process open, and a pool's finalizer would wait for threads that are not there).
"""

from __future__ import annotations

import os
import weakref
from typing import Protocol


class ForkAware(Protocol):
    def forget_after_fork(self) -> object:
        """Drop what belongs to the parent (its pool, its locks); return it to keep."""
        ...


_INSTANCES: weakref.WeakSet[ForkAware] = weakref.WeakSet()
#: What the children's databases dropped, kept from their finalizers.
_KEPT_FROM_PARENT: list[object] = []


def track(instance: ForkAware) -> None:
    """Have ``instance`` forget its parent's state in a forked child."""
    _INSTANCES.add(instance)


def _after_fork_in_child() -> None:
    for instance in list(_INSTANCES):
        _KEPT_FROM_PARENT.append(instance.forget_after_fork())


os.register_at_fork(after_in_child=_after_fork_in_child)
