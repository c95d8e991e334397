"""The worker runtime: register handlers on an App, run them with a Worker.

Its modules, one job each:

* ``app``: App and its per-queue Task settings; ``load_app("module:app")``;
* ``context``: JobContext, what a handler receives (its claim, ``lost``, transactions);
* ``runner``: Worker, the lifecycle (services, supervision, shutdown) and the claim loop;
* ``connections``: the handlers' pools and a connection of its own for each service;
* ``registry``: the attempts running (by claim), free slots, losing an attempt;
* ``attempt``: one attempt, its handler run to an Outcome, then acknowledged;
* ``handlers``: a handler under its task's timeout, on the loop or in a thread;
* ``threads``: the daemon threads sync handlers run in;
* ``leases``: the heartbeat (batched renewals) and each attempt's local deadline;
* ``outcomes``: acknowledgements in batches, one table of kinds, typed answers;
* ``listener``: LISTEN for enqueues, a wake-up hint;
* ``state``: WorkerStats and the record of one attempt;
* ``signals``: counting stop signals (a supervised child merges the group's echo);
* ``supervisor``: ``--processes N``, spawning and restarting worker processes.
"""

from .._retry import Backoff, PermanentError, Retry
from .app import App, Task, load_app
from .context import JobContext
from .runner import Worker
from .state import WorkerStats

__all__ = [
    "App",
    "Backoff",
    "JobContext",
    "PermanentError",
    "Retry",
    "Task",
    "Worker",
    "WorkerStats",
    "load_app",
]
