"""leaseq: a reliable background job queue on the PostgreSQL you already have."""

from .client import AsyncQueue, Queue
from .config import database_url
from .errors import (
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
from .types import (
    Claim,
    Job,
    JobStatus,
    OrderingPolicy,
    QueueSettings,
    QueueStats,
    ReapResult,
)

__version__ = "0.1.0"

__all__ = [
    "AsyncQueue",
    "BacklogFull",
    "Claim",
    "DatabaseUnavailable",
    "InvalidArgument",
    "InvalidJob",
    "Job",
    "JobNotFound",
    "JobStatus",
    "LeaseLost",
    "LeaseqError",
    "NotMigrated",
    "OrderingPolicy",
    "PayloadTooLarge",
    "Queue",
    "QueueSettings",
    "QueueStats",
    "ReapResult",
    "__version__",
    "database_url",
]
