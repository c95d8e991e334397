"""Every error leaseq raises on purpose derives from :class:`LeaseqError`."""

from __future__ import annotations

from typing import Any


class LeaseqError(Exception):
    """Base class of leaseq's own errors."""


class LeaseLost(LeaseqError):
    """A fenced write matched no row: this claim no longer owns its job.

    The lease expired (even if nobody reclaimed the job yet), or a newer claim
    holds the job, or the job left the ``running`` state. Stop the work where
    possible and never acknowledge its result.
    """

    def __init__(self, job_id: int, lease_version: int, operation: str) -> None:
        self.job_id = job_id
        self.lease_version = lease_version
        self.operation = operation
        super().__init__(
            f"{operation} of job {job_id} refused: lease version {lease_version} "
            "is no longer the live claim"
        )

    def __reduce__(self) -> tuple[type[LeaseLost], tuple[int, int, str]]:
        # Pickled back from a process handler: rebuilt from its fields, not its text.
        return type(self), (self.job_id, self.lease_version, self.operation)


class AlreadyCompleted(LeaseLost):
    """A completion inside the caller's transaction found the job already
    completed by this claim: the transaction is a re-run, and its effect must
    roll back (raising this does that when it propagates out of the block)."""

    def __init__(self, job_id: int, lease_version: int, operation: str) -> None:
        super().__init__(job_id, lease_version, operation)
        # (LeaseLost's text would say the claim is not live: it completed.)
        self.args = (
            f"{operation} of job {job_id} refused: lease version {lease_version} already "
            "completed it; this transaction is a re-run, and its effect must roll back",
        )


class InvalidArgument(LeaseqError, ValueError):
    """An argument is out of range or malformed; nothing was written."""


class InvalidJob(InvalidArgument):
    """A job cannot be enqueued as given (queue name, key, payload, delay...)."""


class PayloadTooLarge(InvalidJob):
    """The payload is larger than the queue (or leaseq) accepts."""


class BacklogFull(LeaseqError):
    """The queue's admission limit (jobs or bytes) would be exceeded.

    ``replayed`` holds the ids a bulk replay did put back before the queue was
    full (empty for an enqueue, which writes nothing).
    """

    def __init__(self, message: str, *, replayed: tuple[int, ...] = ()) -> None:
        super().__init__(message)
        self.replayed = replayed

    def __reduce__(self) -> tuple[Any, ...]:
        return _rebuild, (type(self), self.args, {"replayed": self.replayed})


class JobNotFound(LeaseqError, LookupError):
    """No job has this id."""


class NotMigrated(LeaseqError):
    """The leaseq schema does not exist yet: run ``leaseq migrate``."""


class TransientError(LeaseqError):
    """The database could not run the operation just now: the connection was
    lost or refused, the pool had no connection in time, a deadlock or a
    serialization failure. Sending it again may succeed. A write whose
    connection broke during COMMIT may have taken effect: leaseq's fenced
    writes recognise their own resend, so resending them is safe."""


class DatabaseUnavailable(TransientError):
    """No database could be reached or started, or the one reached cannot write
    now: a write refused as read-only on a connection of leaseq's own (a
    failover left the URL on a standby; ``default_transaction_read_only``)."""


class InvalidDatabaseURL(DatabaseUnavailable):
    """No connection can be made with the database URL as it is: libpq cannot
    parse it or refuses one of its values (``sslmode=bogus``), or the server
    refused it for a reason no retry changes (a wrong password, an unknown role
    or database, no ``pg_hba.conf`` entry). Said at the first attempt, without
    waiting out the connect timeout. Unlike its parent's other cases, trying
    again cannot help; a worker stops at once (``leaseq worker`` with one
    ``error:`` line)."""


class StatementTimeout(TransientError):
    """The server cancelled the statement: it ran past the client's
    ``statement_timeout`` (or an operator cancelled it). Nothing it would have
    written was committed."""


class DatabaseError(LeaseqError):
    """The database refused an operation for a reason leaseq has no type of its
    own for: a caller's transaction that had already failed, a revoked grant, a
    constraint of your own on leaseq's tables... ``sqlstate`` says which (the
    driver's error is its ``__cause__``). Sending it again as it is fails again."""

    def __init__(self, message: str, *, sqlstate: str | None = None) -> None:
        super().__init__(message)
        self.sqlstate = sqlstate

    def __reduce__(self) -> tuple[Any, ...]:
        return _rebuild, (type(self), self.args, {"sqlstate": self.sqlstate})


class UniqueKeyHeld(LeaseqError):
    """Another job of the queue holds this unique key (it is unfinished, or done
    within its ``unique_for``): a replay of this job would make it a second one."""


class ResultNotReady(LeaseqError):
    """The job has not finished yet: it has no result to read."""


class JobFailed(LeaseqError):
    """The job ended without a result: failed or cancelled. ``status`` says which,
    ``error`` is its last error."""

    def __init__(self, message: str, *, job_id: int, status: str, error: str | None) -> None:
        super().__init__(message)
        self.job_id = job_id
        self.status = status
        self.error = error

    def __reduce__(self) -> tuple[Any, ...]:
        fields = {"job_id": self.job_id, "status": self.status, "error": self.error}
        return _rebuild, (type(self), self.args, fields)


class InvalidResult(LeaseqError):
    """A handler returned a value that cannot be stored as its job's result: not
    JSON, or larger than its task's ``max_result_bytes``. The job fails with this
    error instead of completing (a retry would return the same value)."""


def _rebuild(cls: type[Exception], args: tuple[Any, ...], fields: dict[str, Any]) -> Exception:
    """Unpickle an error whose constructor takes keyword-only fields."""
    return cls(*args, **fields)
