"""leaseq: a reliable background job queue on the PostgreSQL you already have."""

from .client import AsyncQueue, Queue
from .config import database_url
from .errors import (
    AlreadyCompleted,
    BacklogFull,
    DatabaseUnavailable,
    InvalidArgument,
    InvalidJob,
    JobNotFound,
    LeaseLost,
    LeaseqError,
    NotMigrated,
    PayloadTooLarge,
)
from .retry import Backoff, PermanentError, Retry
from .types import (
    RENEWAL_BUSY,
    Claim,
    Job,
    JobStatus,
    OrderingPolicy,
    QueueSettings,
    QueueStats,
    ReapResult,
    RenewalBusy,
)
from .worker import App, JobContext, Worker

__version__ = "0.1.0"

__all__ = [
    "RENEWAL_BUSY",
    "AlreadyCompleted",
    "App",
    "AsyncQueue",
    "BacklogFull",
    "Backoff",
    "Claim",
    "DatabaseUnavailable",
    "InvalidArgument",
    "InvalidJob",
    "Job",
    "JobContext",
    "JobNotFound",
    "JobStatus",
    "LeaseLost",
    "LeaseqError",
    "NotMigrated",
    "OrderingPolicy",
    "PayloadTooLarge",
    "PermanentError",
    "Queue",
    "QueueSettings",
    "QueueStats",
    "ReapResult",
    "RenewalBusy",
    "Retry",
    "Worker",
    "__version__",
    "database_url",
]
