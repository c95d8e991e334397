"""What the worker keeps about itself and each running attempt."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

from ..types import Claim
from .context import JobContext


@dataclass
class WorkerStats:
    """What a worker did; the numbers operators ask for."""

    claimed: int = 0
    completed: int = 0
    retried: int = 0
    failed: int = 0
    released: int = 0
    lost_leases: int = 0
    timeouts: int = 0
    claim_statements: int = 0
    claim_seconds: float = 0.0
    listen_reconnects: int = 0
    database_errors: int = 0


@dataclass
class Running:
    claim: Claim
    context: JobContext
    task: asyncio.Task[None] | None = None
    renewed_at: float = field(default_factory=time.monotonic)
    lost: bool = False
    acknowledging: bool = False
