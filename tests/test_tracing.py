"""OpenTelemetry: a `send` span per enqueue whose context the job keeps, and a
`process` span in the worker that continues the producer's trace.

The SDK's in-memory exporter records what an application's tracer would export.
A tracer provider can be set once per process, so this module sets one for the
whole test process and each test reads only the spans of its own trace.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import textwrap

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

import leaseq
from leaseq.testing import adrain

from . import process_app
from .clients import Client
from .conftest import ROOT
from .test_worker import Running, _all_finished, _until

EXPORTER = InMemorySpanExporter()


@pytest.fixture(scope="module", autouse=True)
def tracer_provider() -> None:
    current = trace.get_tracer_provider()
    if not isinstance(current, TracerProvider):
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(EXPORTER))
        trace.set_tracer_provider(provider)


def _spans_of(trace_id: int) -> list[ReadableSpan]:
    return [s for s in EXPORTER.get_finished_spans() if s.context.trace_id == trace_id]


def _send_span(parent: trace.Span) -> ReadableSpan:
    (send,) = [
        s for s in _spans_of(parent.get_span_context().trace_id) if s.name.startswith("send ")
    ]
    return send


def _stored_context(client: Client, job_id: int) -> object:
    with client.connection() as conn:
        row = conn.execute(
            f'SELECT trace_context FROM "{client.schema}".job WHERE job_id = %s', (job_id,)
        ).fetchone()
    assert row is not None
    return row[0]


def test_an_enqueue_is_a_send_span_whose_context_the_job_keeps(client: Client) -> None:
    tracer = trace.get_tracer("the application")
    with tracer.start_as_current_span("POST /reports") as request:
        job_id = client.enqueue("reports", {"report": 1})
    trace_id = request.get_span_context().trace_id
    (send,) = [s for s in _spans_of(trace_id) if s.name == "send reports"]
    assert send.kind is SpanKind.PRODUCER
    assert send.parent is not None
    assert send.parent.span_id == request.get_span_context().span_id
    assert send.attributes is not None
    assert send.attributes["messaging.system"] == "leaseq"
    assert send.attributes["messaging.operation.type"] == "send"
    assert send.attributes["messaging.destination.name"] == "reports"
    assert send.attributes["messaging.message.id"] == str(job_id)
    stored = _stored_context(client, job_id)
    assert isinstance(stored, dict)
    # W3C traceparent: version-traceid-spanid-flags; the span id is the send span's.
    _, stored_trace, stored_span, _ = stored["traceparent"].split("-")
    assert int(stored_trace, 16) == trace_id
    assert int(stored_span, 16) == send.context.span_id


def test_a_batch_enqueue_is_one_send_span_for_all_its_jobs(client: Client) -> None:
    tracer = trace.get_tracer("the application")
    with tracer.start_as_current_span("import") as parent:
        ids = client.enqueue_many("reports", [{"n": n} for n in range(3)])
    (send,) = [
        s for s in _spans_of(parent.get_span_context().trace_id) if s.name.startswith("send")
    ]
    assert send.attributes is not None
    assert send.attributes["messaging.batch.message_count"] == 3
    contexts = {str(_stored_context(client, job_id)) for job_id in ids}
    assert len(contexts) == 1  # every job of the batch continues the one send span


def test_a_refused_enqueue_ends_its_span_as_an_error_and_writes_nothing(client: Client) -> None:
    tracer = trace.get_tracer("the application")
    with tracer.start_as_current_span("bad") as parent, pytest.raises(leaseq.InvalidJob):
        client.enqueue("reports", {"n": 1}, priority=10**9)
    (send,) = [
        s for s in _spans_of(parent.get_span_context().trace_id) if s.name.startswith("send")
    ]
    assert send.status.status_code is trace.StatusCode.ERROR
    assert client.list_jobs(leaseq.JobStatus.QUEUED, queue="reports") == []


def test_a_dsn_given_as_the_queue_leaves_its_password_in_no_error_or_span(
    client: Client,
) -> None:
    """A mistake, but the README's promise holds: no secret leaves leaseq. The
    error and the send span (its name, its exception) quoted the queue as given."""
    secret = "Hunter2-Pw-77"
    tracer = trace.get_tracer("the application")
    with (
        tracer.start_as_current_span("mistake") as parent,
        pytest.raises(leaseq.InvalidJob) as refused,
    ):
        client.enqueue(f"postgresql://app:{secret}@db/prod", {})
    assert secret not in str(refused.value)
    send = _send_span(parent)
    assert secret not in repr(send.to_json())
    assert send.status.status_code is trace.StatusCode.ERROR


def _run_without(setup: str, database_url: str, schema: str) -> str:
    script = textwrap.dedent(
        f"""
        import sys
        {setup}
        import leaseq
        with leaseq.Queue({database_url!r}, schema={schema!r}) as queue:
            queue.migrate()
            job_id = queue.enqueue("reports", {{"n": 1}})
            with queue.connection() as conn:
                (context,) = conn.execute(
                    'SELECT trace_context FROM "{schema}".job WHERE job_id = %s', (job_id,)
                ).fetchone()
        print("stored:", context)
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        env={**os.environ},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def test_without_the_extra_nothing_is_traced_and_nothing_stored(
    database_url: str, schema: str
) -> None:
    hidden = "sys.modules['opentelemetry'] = None  # as if the otel extra were not installed"
    assert _run_without(hidden, database_url, schema) == "stored: None"


def test_with_the_api_but_no_sdk_nothing_is_stored(database_url: str, schema: str) -> None:
    assert _run_without("", database_url, schema) == "stored: None"


async def test_the_worker_continues_the_producers_trace(
    aqueue: leaseq.AsyncQueue, database_url: str, schema: str
) -> None:
    app = leaseq.App(schema=schema)
    current: dict[str, trace.SpanContext] = {}

    @app.task("reports")
    async def report(job: leaseq.JobContext) -> None:
        current["reports"] = trace.get_current_span().get_span_context()

    @app.task("exports", max_attempts=1)
    def export(job: leaseq.JobContext) -> None:  # a sync handler, in a thread
        current["exports"] = trace.get_current_span().get_span_context()
        raise ValueError("no such export")

    tracer = trace.get_tracer("the application")
    with tracer.start_as_current_span("POST /reports") as request:
        report_id = await aqueue.enqueue("reports", {"n": 1})
        export_id = await aqueue.enqueue("exports", {"n": 2})
    trace_id = request.get_span_context().trace_id

    worker = Running(leaseq.Worker(app, dsn=database_url, concurrency=2, maintenance=False))
    await _until(lambda: _all_finished(aqueue, "reports"))
    await _until(lambda: _all_finished(aqueue, "exports"))
    await worker.stop()

    spans = {s.name: s for s in _spans_of(trace_id)}
    for queue_name, job_id, outcome in (
        ("reports", report_id, "done"),
        ("exports", export_id, "failed"),
    ):
        send, process = spans[f"send {queue_name}"], spans[f"process {queue_name}"]
        assert process.kind is SpanKind.CONSUMER
        assert process.parent is not None
        assert process.parent.span_id == send.context.span_id  # the producer's trace, continued
        assert process.attributes is not None
        assert process.attributes["messaging.operation.type"] == "process"
        assert process.attributes["messaging.destination.name"] == queue_name
        assert process.attributes["messaging.message.id"] == str(job_id)
        assert process.attributes["leaseq.attempt"] == 1
        assert process.attributes["leaseq.outcome"] == outcome
        # The handler ran inside its span, on the loop and in its thread alike.
        assert current[queue_name].span_id == process.context.span_id
    failed = spans["process exports"]
    assert failed.status.status_code is trace.StatusCode.ERROR
    assert [e.name for e in failed.events] == ["exception"]
    assert spans["process reports"].status.status_code is not trace.StatusCode.ERROR


async def test_a_timed_out_attempt_ends_its_span_as_an_error_a_requested_retry_does_not(
    aqueue: leaseq.AsyncQueue, database_url: str, schema: str
) -> None:
    app = leaseq.App(schema=schema)

    @app.task("slow", timeout=0.3, max_attempts=1)
    async def slow(job: leaseq.JobContext) -> None:
        await asyncio.sleep(10)

    @app.task("later", max_attempts=2)
    async def later(job: leaseq.JobContext) -> None:
        job.retry(delay=3600, reason="the partner's API said later")

    tracer = trace.get_tracer("the application")
    with tracer.start_as_current_span("POST /reports") as request:
        await aqueue.enqueue("slow", {})
        await aqueue.enqueue("later", {})
    await adrain(app)

    spans = {s.name: s for s in _spans_of(request.get_span_context().trace_id)}
    timed_out, retried = spans["process slow"], spans["process later"]
    assert timed_out.attributes is not None
    assert retried.attributes is not None
    assert timed_out.attributes["leaseq.outcome"] == "failed"
    assert timed_out.status.status_code is trace.StatusCode.ERROR
    assert "timed out" in (timed_out.status.description or "")
    assert retried.attributes["leaseq.outcome"] == "retried"
    assert retried.status.status_code is not trace.StatusCode.ERROR


async def test_an_enqueue_outside_any_span_starts_the_trace_its_job_continues(
    aqueue: leaseq.AsyncQueue, database_url: str, schema: str
) -> None:
    app = leaseq.App(schema=schema)
    seen: list[trace.SpanContext] = []

    @app.task("plain")
    async def plain(job: leaseq.JobContext) -> None:
        seen.append(trace.get_current_span().get_span_context())

    EXPORTER.clear()
    await aqueue.enqueue("plain", {"n": 1})  # its send span is a root: a trace of its own
    worker = Running(leaseq.Worker(app, dsn=database_url, concurrency=1, maintenance=False))
    await _until(lambda: _all_finished(aqueue, "plain"))
    await worker.stop()
    (process,) = [s for s in EXPORTER.get_finished_spans() if s.name == "process plain"]
    (send,) = [s for s in EXPORTER.get_finished_spans() if s.name == "send plain"]
    assert process.context.trace_id == send.context.trace_id
    assert seen[0].span_id == process.context.span_id


async def test_a_process_handler_runs_inside_its_attempts_span(
    aqueue: leaseq.AsyncQueue, database_url: str, schema: str
) -> None:
    """executor="process": in the child too, the handler's spans nest under the
    worker's ``process`` span, in the producer's trace."""
    app = leaseq.App(schema=schema)
    app.task("digests", executor="process")(process_app.traced)
    tracer = trace.get_tracer("the application")
    with tracer.start_as_current_span("POST /digests") as request:
        job_id = await aqueue.enqueue("digests", {})
    await adrain(app, dsn=database_url, timeout=60)
    (process,) = [
        s for s in _spans_of(request.get_span_context().trace_id) if s.name == "process digests"
    ]
    seen = await aqueue.result(job_id)
    assert seen == {
        "trace_id": f"{request.get_span_context().trace_id:032x}",
        "span_id": f"{process.context.span_id:016x}",
    }


@pytest.mark.parametrize(
    "stored",
    ['"00-abc"', "[1, 2]", "42", '{"traceparent": 5}', '{"traceparent": ["x", {"y": 1}]}'],
)
async def test_a_trace_context_that_is_no_carrier_is_ignored_and_the_job_runs(
    aqueue: leaseq.AsyncQueue, database_url: str, schema: str, stored: str
) -> None:
    """leaseq writes the column, but any role with UPDATE on the table (a restore, a
    hand-made fix, another tool) may leave something else there. A job's trace is a
    hint: it must never stop the job from being processed and acknowledged."""
    app = leaseq.App(schema=schema)
    ran: list[trace.SpanContext] = []

    @app.task("reports")
    async def report(job: leaseq.JobContext) -> None:
        ran.append(trace.get_current_span().get_span_context())

    job_id = await aqueue.enqueue("reports", {"n": 1})
    async with aqueue.connection() as conn:
        await conn.execute(
            f'UPDATE "{schema}".job SET trace_context = %s::jsonb WHERE job_id = %s',
            (stored, job_id),
        )
    await adrain(app, dsn=database_url, timeout=30)
    job = await aqueue.get(job_id)
    assert (job.status, job.attempts) == (leaseq.JobStatus.DONE, 1)
    assert len(ran) == 1
    assert ran[0].is_valid  # still traced, as a root of its own


async def test_a_handlers_error_is_exported_without_the_secrets_it_quotes(
    aqueue: leaseq.AsyncQueue, database_url: str, schema: str
) -> None:
    """The README: no secret leaves leaseq. The span's exception event is exported
    to whatever backend the application configured, as a log line would be."""
    app = leaseq.App(schema=schema)
    secret = "Sup3r-S3cret-9"

    @app.task("imports", max_attempts=1)
    async def failing(job: leaseq.JobContext) -> None:
        dsn = f"postgresql://app:{secret}@db.internal/prod"
        raise ConnectionError(f"could not reach {dsn}; password={secret}")

    tracer = trace.get_tracer("the application")
    with tracer.start_as_current_span("POST /imports") as request:
        await aqueue.enqueue("imports", {})
    await adrain(app, dsn=database_url, timeout=30)
    (process,) = [
        s for s in _spans_of(request.get_span_context().trace_id) if s.name == "process imports"
    ]
    (event,) = process.events
    assert event.name == "exception"
    attributes = dict(event.attributes or {})
    assert attributes["exception.type"] == "ConnectionError"
    assert "could not reach postgresql://app:***@db.internal" in str(
        attributes["exception.message"]
    )
    assert "Traceback" in str(attributes["exception.stacktrace"])
    assert secret not in repr(process.to_json())


async def test_a_handlers_error_is_exported_without_the_payload_it_quotes(
    aqueue: leaseq.AsyncQueue, database_url: str, schema: str
) -> None:
    """Contract 7 for the span's exception event too: a validator's error quoting
    the job's input (``input_value={...}``) leaves no payload value in the trace."""
    app = leaseq.App(schema=schema)
    payload = {"customer": "acme-7731", "card_number": "4111111111111111", "amount": 129900}

    @app.task("charges", max_attempts=1)
    async def failing(job: leaseq.JobContext) -> None:
        raise ValueError(f"amount: field required [input_value={job.payload!r}]")

    tracer = trace.get_tracer("the application")
    with tracer.start_as_current_span("POST /charges") as request:
        await aqueue.enqueue("charges", payload)
    await adrain(app, dsn=database_url, timeout=30)
    (process,) = [
        s for s in _spans_of(request.get_span_context().trace_id) if s.name == "process charges"
    ]
    (event,) = process.events
    attributes = dict(event.attributes or {})
    assert attributes["exception.type"] == "ValueError"
    assert attributes["exception.message"] == (
        "amount: field required [input_value={'amount': ***, 'customer': '***', "
        "'card_number': '***'}]"
    )
    exported = repr(process.to_json())
    for value in ("acme-7731", "4111111111111111", "129900"):
        assert value not in exported


async def test_an_attempt_whose_lease_was_lost_ends_its_span_as_an_error(
    aqueue: leaseq.AsyncQueue, database_url: str, schema: str
) -> None:
    """An attempt cut short (its running job cancelled by an operator here; a
    handler that outlived its lease alike) produced nothing the queue kept: its
    span must not read as a success in the trace (status unset, as a done one's)."""
    app = leaseq.App(schema=schema)
    started = asyncio.Event()

    @app.task("exports", max_attempts=1)
    async def export(job: leaseq.JobContext) -> None:
        started.set()
        await asyncio.sleep(30)  # cancelled through the lease fence

    tracer = trace.get_tracer("the application")
    with tracer.start_as_current_span("POST /exports") as request:
        job_id = await aqueue.enqueue("exports", {})
    trace_id = request.get_span_context().trace_id
    worker = Running(leaseq.Worker(app, dsn=database_url, concurrency=1, maintenance=False))
    try:
        await asyncio.wait_for(started.wait(), 20)
        assert await aqueue.cancel(job_id, running=True)

        async def span_ended() -> bool:
            return any(s.name == "process exports" for s in _spans_of(trace_id))

        await _until(span_ended)
    finally:
        await worker.stop()
    (process,) = [s for s in _spans_of(trace_id) if s.name == "process exports"]
    assert process.attributes is not None
    assert process.attributes["leaseq.outcome"] == "lease_lost"
    assert process.status.status_code is trace.StatusCode.ERROR
