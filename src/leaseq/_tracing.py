"""OpenTelemetry spans per the messaging conventions, when ``opentelemetry-api`` is there.

* ``send {queue}`` (kind PRODUCER) around an enqueue. The context of that span
  is injected (W3C ``traceparent``/``tracestate``, or whatever propagator the
  application configured) into a small dict stored on the job, so that
* ``process {queue}`` (kind CONSUMER), around a handler in the worker, continues
  the producer's trace: its parent is the ``send`` span, even in another
  process, on another machine, after a retry.

Without the ``otel`` extra (``pip install 'leaseq[otel]'``) every function here
is a no-op and nothing is stored on the job. With the API but no SDK configured
the spans are non-recording and their context is invalid: nothing is stored
either. Attributes follow the OpenTelemetry messaging semantic conventions
(``messaging.system``, ``messaging.operation.type``, ``messaging.destination.name``,
``messaging.message.id``, ``messaging.batch.message_count``), plus leaseq's
attempt and lease version on ``process``.
"""

from __future__ import annotations

import functools
import importlib.metadata
import traceback
from collections.abc import Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any

try:
    from opentelemetry import context as otel_context
    from opentelemetry import propagate, trace
    from opentelemetry.trace import SpanKind, Status, StatusCode
except ImportError:  # the otel extra is not installed: tracing is off
    trace = None  # type: ignore[assignment]

from ._payload_masking import PayloadValues, without_payload
from ._redact import redact
from ._types import Claim

SYSTEM = "leaseq"
#: What a job stores: the propagator's fields (e.g. {"traceparent": "00-..."}).
TraceContext = dict[str, str]


@functools.cache
def _version() -> str:
    return importlib.metadata.version("leaseq")


@functools.cache
def _tracer() -> Any:
    # Cached: before an SDK is configured this is a proxy that delegates to the
    # SDK's tracer once one is set, so it never goes stale.
    return trace.get_tracer("leaseq", _version())


def _nothing_to_trace(parent: Any) -> bool:
    """No SDK is configured and there is no trace to continue: a span would be
    invalid and record nothing (the API's spans cost ~15 µs per job for that)."""
    provider = trace.get_tracer_provider()
    if not isinstance(provider, trace.ProxyTracerProvider | trace.NoOpTracerProvider):
        return False
    return parent is None and not trace.get_current_span().get_span_context().is_valid


class Send:
    """The ``send`` span of one enqueue call: the context to store on its jobs."""

    def __init__(self, span: Any, context: TraceContext | None) -> None:
        self._span = span
        #: Stored on every job of the call (None: no trace to continue).
        self.context = context

    def sent(self, job_ids: Sequence[int]) -> None:
        if self._span is None:
            return
        if len(job_ids) == 1:
            self._span.set_attribute("messaging.message.id", str(job_ids[0]))
        else:
            self._span.set_attribute("messaging.batch.message_count", len(job_ids))


@contextmanager
def send(queue: str, count: int = 1) -> Iterator[Send]:
    """A PRODUCER span around an enqueue of ``count`` jobs into ``queue``."""
    if trace is None or _nothing_to_trace(None):
        yield Send(None, None)
        return
    queue = redact(str(queue))  # checked only inside the span: a DSN given by mistake
    attributes: dict[str, Any] = {
        "messaging.system": SYSTEM,
        "messaging.operation.type": "send",
        "messaging.operation.name": "send",
        "messaging.destination.name": queue,
    }
    if count != 1:
        attributes["messaging.batch.message_count"] = count
    with _tracer().start_as_current_span(
        f"send {queue}", kind=SpanKind.PRODUCER, attributes=attributes
    ) as span:
        carrier: TraceContext = {}
        if span.get_span_context().is_valid:
            propagate.inject(carrier)
        yield Send(span, carrier or None)


class Process:
    """The ``process`` span of one attempt: told how the attempt ended."""

    def __init__(self, span: Any, payload: object = None) -> None:
        self._span = span
        #: The job's payload, whose values the exported error texts leave out.
        self._payload = payload

    def ended(
        self, outcome: str, error: BaseException | None = None, description: str | None = None
    ) -> None:
        """Record how the attempt ended: ``error`` the exception its handler raised,
        ``description`` an error without one (a timeout)."""
        if self._span is None:
            return
        self._span.set_attribute("leaseq.outcome", outcome)
        if description is not None:
            text = redact(without_payload(description, self._payload))
            self._span.set_status(Status(StatusCode.ERROR, text))
        if error is not None:
            # Not span.record_exception(): it exports the error's text and traceback
            # as they are, and a handler's error may quote a DSN with its password,
            # or the job's payload (contract 7).
            self._span.add_event("exception", _exception_attributes(error, self._payload))
            self._span.set_status(Status(StatusCode.ERROR, type(error).__name__))


def _exception_attributes(error: BaseException, payload: object) -> dict[str, str]:
    """The semantic conventions' exception event, its texts scrubbed of secrets and
    of the job's payload values."""
    kind, module = type(error), type(error).__module__
    attributes = {
        "exception.type": kind.__qualname__
        if module in ("builtins", "")
        else f"{module}.{kind.__qualname__}",
        "exception.escaped": "False",
    }
    try:
        attributes["exception.message"] = redact(without_payload(str(error), payload))
        attributes["exception.stacktrace"] = redact(_stacktrace(error, payload))
    except Exception:  # an error whose text cannot be rendered still gets its event
        attributes.setdefault("exception.message", f"({kind.__qualname__}: no text)")
    return attributes


def _stacktrace(error: BaseException, payload: object) -> str:
    """The traceback, each of its parts without the payload's values: searched part
    by part, a long traceback is not cut where one long text would be."""
    values = PayloadValues(payload)
    return "".join(values.mask(part) for part in traceback.format_exception(error))


def current() -> TraceContext | None:
    """The current span's context as a carrier, for a handler's child process
    (None: no span to continue)."""
    if trace is None or not trace.get_current_span().get_span_context().is_valid:
        return None
    carrier: TraceContext = {}
    propagate.inject(carrier)
    return carrier or None


@contextmanager
def continued(carrier: Mapping[str, str] | None) -> Iterator[None]:
    """Run under the span context of ``carrier`` (what :func:`current` gave in the
    worker): in a child process, the handler's own spans nest under ``process``."""
    if trace is None or not carrier:
        yield
        return
    token = otel_context.attach(propagate.extract(dict(carrier)))
    try:
        yield
    finally:
        otel_context.detach(token)


def active() -> bool:
    """Whether a span started here now could record or continue a trace (an SDK is
    configured, or a span is current). The worker asks once per claim, not per job:
    its attempts start in the claim loop's context, and the provider check reads
    the environment (~2 µs)."""
    return trace is not None and not _nothing_to_trace(None)


def process(
    claim: Claim, trace_context: Mapping[str, str] | None, *, active: bool | None = None
) -> AbstractContextManager[Process]:
    """A CONSUMER span around one attempt's handler, a child of the job's ``send``.

    ``active``: what :func:`active` said for this claim (None: ask now). With
    nothing to trace, one shared no-op (no generator per job: the worker runs
    this for every job).
    """
    if trace is None or (active is False and not trace_context):
        return _NOT_TRACED
    if active is None and _nothing_to_trace(trace_context or None):
        return _NOT_TRACED
    return _process_span(claim, trace_context)


@contextmanager
def _process_span(claim: Claim, trace_context: Mapping[str, str] | None) -> Iterator[Process]:
    carrier = _carrier(trace_context)
    parent = propagate.extract(carrier) if carrier else None
    attributes: dict[str, Any] = {
        "messaging.system": SYSTEM,
        "messaging.operation.type": "process",
        "messaging.operation.name": "process",
        "messaging.destination.name": claim.queue,
        "messaging.message.id": str(claim.job_id),
        "leaseq.attempt": claim.attempts,
        "leaseq.lease_version": claim.lease_version,
    }
    if claim.key is not None:
        attributes["leaseq.ordering_key"] = claim.key
    with _tracer().start_as_current_span(
        f"process {claim.queue}",
        context=parent,
        kind=SpanKind.CONSUMER,
        attributes=attributes,
        record_exception=False,  # the attempt reports its own outcome (ended())
        set_status_on_exception=False,
    ) as span:
        yield Process(span, claim.payload)


def _carrier(stored: object) -> TraceContext | None:
    """The text fields of a job's stored context. leaseq writes a JSON object of
    strings, but the column is plain jsonb that anyone with UPDATE may change, and
    a propagator handed another shape raises: the trace is then started afresh
    rather than the job made unprocessable."""
    if not isinstance(stored, Mapping):
        return None
    return {k: v for k, v in stored.items() if isinstance(k, str) and isinstance(v, str)}


#: What :func:`process` gives when there is nothing to trace.
_NOT_TRACED = nullcontext(Process(None))
