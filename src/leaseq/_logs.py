"""leaseq's loggers: every record they create is scrubbed of secrets first.

A logger's filter runs only for records created on that very logger (not for
its children's), so each module takes its logger from :func:`get_logger`, which
attaches :class:`RedactingFilter`. The filter renders the message and the
traceback itself, scrubbed, and drops the live exception: a handler that would
render ``exc_info`` on its own (rich's tracebacks show local variables, a DSN
among them) gets the scrubbed text instead.
"""

from __future__ import annotations

import logging

from ._redact import redact

_TRACEBACKS = logging.Formatter()


class RedactingFilter(logging.Filter):
    """Replace a record's message, traceback and stack with scrubbed text."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.msg = redact(_message(record))
        record.args = ()
        if record.exc_info:
            if isinstance(record.exc_info, tuple) and record.exc_info[0] is not None:
                record.exc_text = record.exc_text or _traceback(record)
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


def _traceback(record: logging.LogRecord) -> str:
    assert record.exc_info is not None
    try:
        return _TRACEBACKS.formatException(record.exc_info)
    except Exception:
        return f"(a traceback of {record.exc_info[0]!r} that could not be rendered)"


_FILTER = RedactingFilter()


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
