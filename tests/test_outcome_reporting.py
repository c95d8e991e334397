"""What operators read of an attempt's outcome agrees: leaseq_worker_running_jobs
counts no job its own transaction completed, and a lost attempt's span says
lease_lost, as its metric and its log line do."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable

import psycopg
import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan
from prometheus_client.parser import text_string_to_metric_families

import leaseq

from . import test_tracing as _tracing_tests
from .test_metrics import _until

Connect = Callable[..., psycopg.Connection[tuple[object, ...]]]


def _gauge(metrics: leaseq.Metrics, name: str) -> float:
    for family in text_string_to_metric_families(metrics.text()):
        for sample in family.samples:
            if sample.name == name and not sample.labels:
                return sample.value
    raise AssertionError(f"{name} not exposed")


# -- leaseq_worker_running_jobs -----------------------------------------------------------


@pytest.mark.asyncio
async def test_a_job_completed_by_its_own_transaction_is_not_running_while_its_hooks_run(
    aqueue: leaseq.AsyncQueue, database_url: str, schema: str
) -> None:
    """README: leaseq_worker_running_jobs counts "attempts whose handler has not
    returned". A handler that completes its job through job.transaction() (the
    README's own pattern) and has returned was still counted as running for as
    long as its on_success hook ran; the same job completed by returning was not."""
    metrics = leaseq.Metrics()
    app = leaseq.App(schema=schema)
    in_hook = threading.Event()
    leave_hook = threading.Event()
    returned: list[str] = []

    @app.on_success
    def slow_hook(job: leaseq.JobContext, result: object) -> None:
        in_hook.set()
        leave_hook.wait(30)

    @app.task("tx")
    def completes_itself(job: leaseq.JobContext) -> None:
        with job.transaction() as conn:
            conn.execute("SELECT 1")
        returned.append("tx")

    @app.task("plain")
    def returns(job: leaseq.JobContext) -> None:
        returned.append("plain")

    worker = leaseq.Worker(
        app, dsn=database_url, poll_interval=0.1, maintenance=False, metrics=metrics
    )
    task = asyncio.create_task(worker.run())
    try:
        seen: dict[str, float] = {}
        for name in ("plain", "tx"):
            in_hook.clear()
            leave_hook.clear()
            await aqueue.enqueue(name, {})
            await _until(in_hook.is_set)
            assert returned[-1] == name  # its handler has returned; its hook runs
            seen[name] = _gauge(metrics, "leaseq_worker_running_jobs")
            leave_hook.set()
        assert seen == {"plain": 0, "tx": 0}
    finally:
        leave_hook.set()
        worker.request_stop()
        await asyncio.wait_for(task, 30)


# -- OpenTelemetry ------------------------------------------------------------------------

# The tracer provider of tests/test_tracing.py (one provider per process), its
# exporter: whichever module runs first sets it up, the other reads its spans.
tracer_provider = _tracing_tests.tracer_provider


@pytest.mark.asyncio
async def test_a_lost_attempts_span_says_lease_lost_as_its_metric_and_log_do(
    aqueue: leaseq.AsyncQueue, database_url: str, schema: str
) -> None:
    """README: a process span carries ``leaseq.outcome``; the metric's label for an
    attempt that lost its lease is ``lease_lost`` (and so is the log record's
    ``outcome``). The span said ``lost``: a dashboard joining traces to the
    metrics' outcomes found no such outcome."""
    metrics = leaseq.Metrics()
    app = leaseq.App(schema=schema)
    started = asyncio.Event()

    @app.task("slow")
    async def slow(job: leaseq.JobContext) -> None:
        started.set()
        await asyncio.sleep(60)  # cancelled once its claim is cut

    tracer = trace.get_tracer("the application")
    with tracer.start_as_current_span("POST /slow") as request:
        job_id = await aqueue.enqueue("slow", {})
    worker = leaseq.Worker(
        app, dsn=database_url, poll_interval=0.1, maintenance=False, metrics=metrics
    )
    task = asyncio.create_task(worker.run())
    try:
        await asyncio.wait_for(started.wait(), 30)
        await aqueue.cancel(job_id, running=True)  # its lease ends through the fence
        await _until(lambda: worker.stats.lost_leases == 1)

        def ended() -> list[ReadableSpan]:
            trace_id = request.get_span_context().trace_id
            return [
                s
                for s in _tracing_tests.EXPORTER.get_finished_spans()
                if s.context.trace_id == trace_id and s.name == "process slow"
            ]

        await _until(lambda: bool(ended()))
    finally:
        worker.request_stop()
        await asyncio.wait_for(task, 30)
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(metrics.text())
        for s in family.samples
    }
    key = ("leaseq_jobs_finished_total", (("outcome", "lease_lost"), ("queue", "slow")))
    assert samples[key] == 1
    (span,) = ended()
    assert span.attributes is not None
    assert span.attributes["leaseq.outcome"] == "lease_lost"
