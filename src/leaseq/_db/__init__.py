"""The only package that talks to the driver: the pools (``database``, sync;
``async_database``, asyncio, with the worker's sessions), the rules for opening
and giving them up (``pool_rules``), execution (``execution``), the connections'
settings (``options``) and the error mapping (``errors``).

``_store`` builds :class:`~leaseq._statement.Operation` values (and steps of
them); this package runs them on psycopg 3 connections, sync or async, and turns
the driver's errors into leaseq's typed errors, so that nothing above it needs
to know psycopg's exception classes: errors that say "try again later" become
:class:`TransientError`, those that mean something to users their own types.
"""

from __future__ import annotations

from .async_database import AsyncDatabase, Session
from .database import Database
from .errors import LockWaitOver, translated_errors
from .execution import AsyncConnection, Connection
from .options import (
    ASYNC_ACKNOWLEDGEMENT_OPTIONS,
    CONNECTION_OPTIONS,
    SERVICE_OPTIONS,
    WORKER_OPTIONS,
    with_statement_timeout,
)

# Re-exported: what the clients need of the pools and the connections' settings.
__all__ = [
    "ASYNC_ACKNOWLEDGEMENT_OPTIONS",
    "CONNECTION_OPTIONS",
    "SERVICE_OPTIONS",
    "WORKER_OPTIONS",
    "AsyncConnection",
    "AsyncDatabase",
    "Connection",
    "Database",
    "LockWaitOver",
    "Session",
    "translated_errors",
    "with_statement_timeout",
]
