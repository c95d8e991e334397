"""Every queue operation, written once and without I/O.

Each public method of :class:`Store` returns an
:class:`~leaseq._statement.Operation`: the SQL, its parameters and a function
that turns the rows into the result. The database layer executes it on a sync
or an async connection; neither side builds SQL of its own. The SQL itself
lives in ``sql/*.sql``. The store is split by who needs the operation:
producers, workers (jobs), operators, inspection (searches, summaries),
retention, health, monitoring, periodic jobs, the schema, the workers'
wake-up entries.
"""

from __future__ import annotations

from .health import HealthOperations
from .inspection import InspectionOperations
from .jobs import UNIQUE_VIOLATION, Claimed, JobOperations
from .monitoring import MonitoringOperations
from .operators import OperatorOperations, ReplayBatch
from .producers import ProducerOperations
from .retention import RetentionOperations
from .schedules import ScheduleOperations
from .schema import SchemaOperations
from .waiting import WaitingOperations


class Store(
    ProducerOperations,
    JobOperations,
    OperatorOperations,
    InspectionOperations,
    RetentionOperations,
    HealthOperations,
    MonitoringOperations,
    ScheduleOperations,
    SchemaOperations,
    WaitingOperations,
):
    """Builds the operations of one leaseq schema."""


__all__ = ["UNIQUE_VIOLATION", "Claimed", "ReplayBatch", "Store"]
