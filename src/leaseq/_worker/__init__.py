"""The worker runtime: register handlers on an App, run them with a Worker."""

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
