"""`leaseq demo`: the service, worker processes, a burst of requests, live progress.

Starts (or reuses) the database, resets the demo schema, serves the HTTP API on
127.0.0.1, starts worker processes, submits a burst of report requests over
HTTP, shows progress, fixes and replays the deliberately broken reports, and
ends with a summary whose checks must hold: every request accepted, every
report done, no duplicate report or notification, ordered reports in order.
"""

from __future__ import annotations

import asyncio
import os
import signal
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from psycopg.conninfo import conninfo_to_dict
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

import leaseq

from . import QUEUE, SCHEMA, sql
from .pages import DASHBOARD
from .processes import Terminated, Workers, serving, stop_signals


@dataclass
class Outcome:
    requests: int
    accepted: int = 0
    latencies: list[float] = field(default_factory=list)
    failed_before_fix: int = 0
    killed_worker: bool = False
    summary: tuple[int, ...] = ()
    stats: leaseq.QueueStats | None = None

    @property
    def ok(self) -> bool:
        if not self.summary:
            return False
        (
            _,
            reports,
            duplicate_reports,
            _,
            _,
            duplicate_keys,
            duplicate_notifications,
            out_of_order,
            _,
        ) = self.summary
        return (
            self.accepted == self.requests
            and reports == self.requests
            and duplicate_reports == 0
            and duplicate_keys == 0
            and duplicate_notifications == 0
            and out_of_order == 0
        )


def plan(requests: int) -> list[dict[str, str]]:
    """A deterministic burst: mostly standard, some flaky, a few broken, two ordered series."""
    bodies = []
    for n in range(requests):
        if n % 5 == 4:
            customer, kind = f"ordered-{n % 2}", "ordered"
        elif n % 15 == 7:
            customer, kind = f"customer-{n % 7}", "broken"
        elif n % 6 == 1:
            customer, kind = f"customer-{n % 7}", "flaky"
        else:
            customer, kind = f"customer-{n % 7}", "standard"
        month = 1 + (n // 5) % 12 if kind == "ordered" else 1 + n % 12
        year = 2026 + (n // 60) if kind == "ordered" else 2026
        bodies.append({"customer": customer, "period": f"{year}-{month:02d}", "kind": kind})
    return bodies


def _where(url: str) -> str:
    """Which database, without the URL (and so without any password)."""
    try:
        params = conninfo_to_dict(url)
    except Exception:  # the driver's error may quote the URL; the queue says why
        return "a URL libpq cannot parse"
    return f"{params.get('dbname', '?')} at {params.get('host', 'localhost')}"


def prepare(queue: leaseq.Queue) -> None:
    with queue.connection() as conn:
        sql.fetch(conn, "reset")
    queue.migrate()
    with queue.connection() as conn:
        sql.fetch(conn, "tables")
    queue.configure_queue(QUEUE, lease=5)


async def burst(base_url: str, bodies: list[dict[str, str]], outcome: Outcome) -> None:
    """Submit the requests, 8 in flight at a time; time each from send to answer."""
    in_flight = asyncio.Semaphore(8)
    limits = httpx.Limits(max_connections=8)
    async with httpx.AsyncClient(base_url=base_url, limits=limits, timeout=30) as client:

        async def submit(body: dict[str, str]) -> None:
            async with in_flight:  # (not timed: waiting for a free slot is the client's)
                started = time.perf_counter()
                response = await client.post("/reports", json=body)
                outcome.latencies.append(time.perf_counter() - started)
            if response.status_code == 202:
                outcome.accepted += 1

        # Ordered reports must be submitted in period order, per customer.
        for body in (b for b in bodies if b["kind"] == "ordered"):
            await submit(body)
        await asyncio.gather(*(submit(b) for b in bodies if b["kind"] != "ordered"))


def run_demo(
    database_url: str | None = None,
    *,
    once: bool = False,
    requests: int = 60,
    processes: int = 2,
    concurrency: int = 4,
    kill_worker: bool = False,
    port: int = 0,
) -> int:
    """The demo; its exit status (128 + SIGTERM when stopped by SIGTERM)."""
    console = Console()
    # From the start, not once serving: SIGTERM's default action ended the demo
    # without its finally blocks, and its service and workers (in sessions of
    # their own) ran on as orphans.
    with stop_signals():
        try:
            return _run_demo(
                database_url,
                console,
                once=once,
                requests=requests,
                processes=processes,
                concurrency=concurrency,
                kill_worker=kill_worker,
                port=port,
            )
        except Terminated:
            console.print("stopped by SIGTERM")
            return 128 + signal.SIGTERM


def _run_demo(
    database_url: str | None,
    console: Console,
    *,
    once: bool,
    requests: int,
    processes: int,
    concurrency: int,
    kill_worker: bool,
    port: int,
) -> int:
    url = leaseq.database_url(database_url)
    outcome = Outcome(requests)
    with leaseq.Queue(url, schema=SCHEMA) as queue:
        console.print(f"[bold]leaseq demo[/] — database: {_where(url)}")
        logs = Path(tempfile.mkdtemp(prefix="leaseq-demo-"))
        prepare(queue)
        workers = Workers(url, concurrency, logs)
        with serving(url, port, logs) as base_url:
            try:
                for _ in range(processes):
                    workers.start()
                workers.wait_ready()
                console.print(
                    f"service: {base_url}/  ·  dashboard: {base_url}{DASHBOARD}/"
                    "  (open them while the burst runs)"
                )
                asyncio.run(burst(base_url, plan(requests), outcome))
                console.print(f"submitted {requests} report requests to {base_url}/reports")
                _follow(
                    queue,
                    outcome,
                    workers=workers,
                    kill_worker=kill_worker,
                    console=console,
                    title="generating reports",
                )
                outcome.failed_before_fix = queue.stats(QUEUE)[0].failed
                _fix_and_replay(queue)
                _follow(
                    queue,
                    outcome,
                    workers=workers,
                    kill_worker=False,
                    console=console,
                    title="replaying after the fix",
                )
                outcome.stats = queue.stats(QUEUE)[0]
                with queue.connection() as conn:
                    outcome.summary = tuple(sql.fetch(conn, "summary")[0])
                _print_summary(console, outcome, base_url, logs)
                if not once:
                    with queue.connection() as conn:  # for whoever tries it by hand
                        sql.fetch(conn, "set_flag", name="fixed", enabled=False)
                    _serve_until_interrupted(console, base_url)
            finally:
                workers.stop()
    return 0 if outcome.ok else 1


def _follow(
    queue: leaseq.Queue,
    outcome: Outcome,
    *,
    workers: Workers,
    kill_worker: bool,
    console: Console,
    title: str,
) -> None:
    """A live progress bar until nothing is queued or running."""
    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[counts]}"),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=console) as progress:
        bar = progress.add_task(title, total=outcome.requests, counts="")
        while True:
            (stats,) = queue.stats(QUEUE)
            with queue.connection() as conn:
                retried = sql.fetch(conn, "summary")[0][-1]
            done = stats.counts[leaseq.JobStatus.DONE]
            counts = (
                f"queued {stats.queued}  running {stats.running}  done {done}"
                f"  retried {retried}  failed {stats.failed}"
            )
            progress.update(bar, completed=done + stats.failed, counts=counts)
            if kill_worker and not outcome.killed_worker and done >= 3:
                victim = workers.processes[0]
                os.kill(victim.pid, signal.SIGKILL)  # mid-burst, mid-job, no goodbye
                victim.wait(10)
                outcome.killed_worker = True
                workers.start()
                progress.console.print(
                    f"killed worker pid {victim.pid} with SIGKILL; "
                    "its jobs return when their leases expire"
                )
            if stats.queued == 0 and stats.running == 0:
                return
            time.sleep(0.2)


def _fix_and_replay(queue: leaseq.Queue) -> None:
    with queue.connection() as conn:
        sql.fetch(conn, "set_flag", name="fixed", enabled=True)
    queue.replay_failed(QUEUE)


def _print_summary(console: Console, outcome: Outcome, base_url: str, logs: Path) -> None:
    (
        requests,
        reports,
        duplicate_reports,
        calls,
        deliveries,
        duplicate_keys,
        duplicate_notifications,
        out_of_order,
        retries,
    ) = outcome.summary
    latencies = sorted(outcome.latencies)
    p50 = statistics.median(latencies) * 1000 if latencies else 0.0
    p99 = latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))] * 1000 if latencies else 0
    table = Table(title="leaseq demo summary", show_header=False)
    table.add_column(style="bold")
    table.add_column()
    rows = [
        ("requests accepted (HTTP 202)", f"{outcome.accepted} of {outcome.requests}"),
        ("response time p50 / p99", f"{p50:.1f} ms / {p99:.1f} ms"),
        ("reports done", f"{reports} of {requests}"),
        ("retries (transient errors, expired leases)", str(retries)),
        (
            "failed (broken kind), then replayed after the fix",
            f"{outcome.failed_before_fix} failed -> all done",
        ),
        ("worker killed with SIGKILL mid-burst", "yes" if outcome.killed_worker else "no"),
        ("duplicate reports", str(duplicate_reports)),
        ("notification calls / delivered", f"{calls} / {deliveries}"),
        ("duplicate notifications", str(duplicate_keys + duplicate_notifications)),
        ("ordered reports out of order", str(out_of_order)),
        ("service (request a report)", f"{base_url}/"),
        ("a finished report", f"{base_url}/reports/1"),
        ("dashboard", f"{base_url}{DASHBOARD}/"),
        ("worker logs", str(logs)),
    ]
    for name, value in rows:
        table.add_row(name, value)
    console.print(table)
    console.print("[bold green]all checks hold[/]" if outcome.ok else "[bold red]CHECKS FAILED[/]")


def _serve_until_interrupted(console: Console, base_url: str) -> None:
    console.print(
        f"serving {base_url}/ (request a report there) and the dashboard at {base_url}{DASHBOARD}/"
    )
    console.print(
        "the 'broken' template is missing again: request a broken report, find it in the "
        "dashboard's Failed page, fix the template on the home page, replay it from there"
    )
    console.print(
        f"or: curl -X POST {base_url}/reports "
        "-H 'content-type: application/json' "
        """-d '{"customer": "acme", "period": "2026-11", "kind": "standard"}'"""
    )
    console.print("press Ctrl-C to stop (workers finish their jobs first)")
    try:
        while True:  # until Ctrl-C or SIGTERM (stop_signals raises them here)
            time.sleep(0.5)
    except (KeyboardInterrupt, Terminated):
        pass  # the way to stop it once the burst is over: not a failure
    console.print("stopping...")
