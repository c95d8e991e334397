"""leaseq: a reliable background job queue on the PostgreSQL you already have."""

from ._async_client import AsyncQueue
from ._config import database_url
from ._errors import (
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
    TransientError,
)
from ._maintenance import Maintenance
from ._metrics import DEFAULT as metrics
from ._metrics import Metrics
from ._retry import Backoff, PermanentError, Retry
from ._sync_client import Queue
from ._types import (
    RENEWAL_BUSY,
    Claim,
    ClaimPlan,
    CleanupHolder,
    Health,
    IndexHealth,
    Job,
    JobStatus,
    OrderingPolicy,
    PruneResult,
    QueueSettings,
    QueueStats,
    ReapResult,
    RenewalBusy,
    RetentionMode,
    TableHealth,
)
from ._worker import App, JobContext, Worker

__version__ = "0.1.0"

__all__ = [
    "RENEWAL_BUSY",
    "AlreadyCompleted",
    "App",
    "AsyncQueue",
    "BacklogFull",
    "Backoff",
    "Claim",
    "ClaimPlan",
    "CleanupHolder",
    "DatabaseUnavailable",
    "Health",
    "IndexHealth",
    "InvalidArgument",
    "InvalidJob",
    "Job",
    "JobContext",
    "JobNotFound",
    "JobStatus",
    "LeaseLost",
    "LeaseqError",
    "Maintenance",
    "Metrics",
    "NotMigrated",
    "OrderingPolicy",
    "PayloadTooLarge",
    "PermanentError",
    "PruneResult",
    "Queue",
    "QueueSettings",
    "QueueStats",
    "ReapResult",
    "RenewalBusy",
    "RetentionMode",
    "Retry",
    "TableHealth",
    "TransientError",
    "Worker",
    "__version__",
    "database_url",
    "metrics",
]
