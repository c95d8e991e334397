"""leaseq's loggers: every record they create is scrubbed of secrets first.

A logger's filter runs only for records created on that very logger (not for
its children's), so each module takes its logger from :func:`get_logger`, which
attaches :class:`RedactingFilter`. The filter renders the message and the
traceback itself, scrubbed, and drops the live exception: a handler that would
render ``exc_info`` on its own (rich's tracebacks show local variables, a DSN
among them) gets the scrubbed text instead. A record about a job carries its
payload for the filter alone (:data:`PAYLOAD`, dropped before any handler sees
it): its traceback is rendered without the payload's values, as the job's stored
error is (a hook's error chained to the handler's, which quoted its input).
"""

from __future__ import annotations

import json
import logging
import traceback
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from ._payload_masking import PayloadFree, PayloadValues, without_payload
from ._redact import redact
from ._types import Claim

_TRACEBACKS = logging.Formatter()


class RedactingFilter(logging.Filter):
    """Replace a record's message, traceback and stack with scrubbed text."""

    def filter(self, record: logging.LogRecord) -> bool:
        # Taken off the record first: no handler (an app's JSON logger that dumps
        # every extra field) ever gets the payload itself.
        payload = record.__dict__.pop(PAYLOAD, None)
        record.msg = redact(_message(record))
        record.args = ()
        if record.exc_info:
            if isinstance(record.exc_info, tuple) and record.exc_info[0] is not None:
                record.exc_text = record.exc_text or _traceback(record, payload)
            record.exc_info = None
        if record.exc_text:
            record.exc_text = redact(record.exc_text)
        if record.stack_info:
            record.stack_info = redact(record.stack_info)
        return True


def _message(record: logging.LogRecord) -> str:
    # A filter that raised would raise into the code that logged: never do.
    try:
        return record.getMessage()
    except Exception:
        try:
            return f"{record.msg!r} (with arguments it cannot be formatted with: {record.args!r})"
        except Exception:
            return "(a log message that could not be rendered)"


def _traceback(record: logging.LogRecord, payload: object = None) -> str:
    assert record.exc_info is not None
    try:
        if payload is None:
            return _TRACEBACKS.formatException(record.exc_info)
        # Part by part, as a span's stacktrace: a long traceback masked as one text
        # would be cut (PayloadValues.mask cuts a long text).
        values = PayloadValues(payload)
        parts = traceback.format_exception(*record.exc_info)
        return "".join(values.mask(part) for part in parts).rstrip("\n")
    except Exception:
        return f"(a traceback of {record.exc_info[0]!r} that could not be rendered)"


_FILTER = RedactingFilter()

#: The fields a log record about a job carries (``extra=job_fields(claim)``), so
#: that a log search can follow one job, or one attempt of it, across workers.
JOB_FIELDS = ("queue", "job_id", "attempt", "lease_version")
#: Further context some records carry.
CONTEXT_FIELDS = ("task", "outcome", "duration_seconds", "error")
#: The job's payload on a record about it: for :class:`RedactingFilter` only, which
#: renders the record's traceback without the payload's values and drops it.
PAYLOAD = "leaseq_payload"


def job_fields(claim: Claim, **context: object) -> dict[str, object]:
    """``extra=`` of a record about one attempt of a job: who it is about (and its
    payload, whose values its traceback, if any, is rendered without)."""
    return {
        "queue": claim.queue,
        "job_id": claim.job_id,
        "attempt": claim.attempts,
        "lease_version": claim.lease_version,
        PAYLOAD: claim.payload,
        **context,
    }


def error_repr(error: object, payload: object) -> str:
    """``repr(error)`` for a record about a job: without the job's payload values
    (contract 7, as in its stored error), its type's name kept whole; never raises."""
    name = type(error).__name__
    try:
        text = repr(error)
    except Exception:
        return f"{name} (its text could not be rendered)"
    if isinstance(error, PayloadFree):
        return text
    head = name if isinstance(error, BaseException) and text.startswith(name) else ""
    return head + without_payload(text[len(head) :], payload)


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time (UTC, ISO 8601), level, logger, message, the
    job's fields when the record is about a job, and the traceback when there is one
    (already scrubbed by :class:`RedactingFilter`)."""

    def format(self, record: logging.LogRecord) -> str:
        document: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": redact(_message(record)),
        }
        fields: Mapping[str, Any] = record.__dict__
        for name in (*JOB_FIELDS, *CONTEXT_FIELDS):
            value = fields.get(name)
            if value is not None:
                document[name] = redact(value) if isinstance(value, str) else value
        if record.exc_info and not record.exc_text:
            record.exc_text = redact(_traceback(record))
        if record.exc_text:
            document["traceback"] = record.exc_text
        return json.dumps(document, default=str)


def get_logger(name: str) -> logging.Logger:
    """``logging.getLogger(name)``, scrubbed."""
    logger = logging.getLogger(name)
    logger.addFilter(_FILTER)  # a no-op when already there
    return logger


get_logger("leaseq")
# The driver's loggers: leaseq's pools log their connection errors there, and
# libpq may quote a DSN's password in one (a password it cannot percent-decode).
for _driver in ("psycopg", "psycopg.pool"):
    get_logger(_driver)
