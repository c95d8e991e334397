"""What every adapter shares: the recorder its handler calls, the ledger the driver
checks, and a worker process's lifecycle.

Standard library and psycopg only: this module is imported by adapters running in
each system's own virtualenv (the leaseq .venv, bench/.venvs/procrastinate, ...),
and psycopg is the one database driver all of them have.
"""

from __future__ import annotations

import asyncio
import json
import os
import resource
import signal
import subprocess
import sys
import time
from array import array
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from psycopg.conninfo import make_conninfo


def cpu_seconds() -> float:
    """user + sys of this process so far."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


#: Jiffies per second of /proc/stat.
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def machine_ticks() -> tuple[int, int]:
    """(busy, total) jiffies of all CPUs from /proc/stat. Busy is the work done on
    this machine (user, nice, system, irq, softirq); idle, iowait and steal (the
    time a hypervisor gave to other guests) are not. Guest time is already in
    user, so its fields are not added again."""
    with open("/proc/stat") as stat:
        user, nice, system, idle, iowait, irq, softirq, steal = (
            int(v) for v in stat.readline().split()[1:9]
        )
    busy = user + nice + system + irq + softirq
    return busy, busy + idle + iowait + steal


def rss_kib(pid: int) -> int | None:
    """VmRSS of a process, None once it is gone."""
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except FileNotFoundError:
        return None
    return None


@dataclass
class Recorder:
    """What the no-op handler does: note its sequence number and its start time.

    Appending to two lists is all the per-job work, so the bookkeeping costs the
    systems the same ~1 µs. CPU and /proc/stat are snapshotted at the first job,
    so that the process's start-up (imports, connections) is not charged per job.
    With a `capacity` (the soak, whose worker's RSS is measured) the record is
    preallocated and written in place (a run count and a start time per sequence
    number), so the harness's own memory does not grow with the jobs.
    """

    stop_after: int | None = None
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    #: With a gate, the first handler says "ready" (a file) and every handler waits
    #: for "go": several worker processes then start together with full slots,
    #: instead of the first one up draining the backlog before the second started.
    ready_file: Path | None = None
    go: asyncio.Event = field(default_factory=asyncio.Event)
    capacity: int | None = None
    seqs: list[int] = field(default_factory=list)
    starts: list[float] = field(default_factory=list)
    count: int = 0
    first_start: float | None = None
    last_finish: float | None = None
    cpu_first: float = 0.0
    ticks_first: tuple[int, int] = (0, 0)

    def __post_init__(self) -> None:
        if self.capacity is not None:
            self.runs = bytearray(self.capacity)
            self.start_at = array("d", [0.0]) * self.capacity  # written now: resident now

    async def admit(self) -> None:
        if self.ready_file is None or self.go.is_set():
            return
        if not self.ready_file.exists():
            self.ready_file.touch()
        await self.go.wait()

    def started(self, seq: int) -> None:
        now = time.time()
        if self.first_start is None:
            self.first_start = now
            self.cpu_first = cpu_seconds()
            self.ticks_first = machine_ticks()
        if self.capacity is None:
            self.seqs.append(seq)
            self.starts.append(now)
        else:
            self.runs[seq] = min(self.runs[seq] + 1, 255)  # a second run is all it takes
            self.start_at[seq] = now
        self.count += 1
        if self.stop_after is not None and self.count >= self.stop_after:
            self.stop.set()

    def finished(self) -> None:
        self.last_finish = time.time()

    def dump(self, path: Path, cpu_at_stop: float, ticks_at_stop: tuple[int, int]) -> None:
        seqs, starts = self.seqs, self.starts
        if self.capacity is not None:
            seqs = [seq for seq, runs in enumerate(self.runs) for _ in range(runs)]
            starts = [self.start_at[seq] for seq in seqs]
        path.write_text(
            json.dumps(
                {
                    "seqs": seqs,
                    "starts": starts,
                    "first_start": self.first_start,
                    "last_finish": self.last_finish,
                    "cpu_s": cpu_at_stop - self.cpu_first if self.first_start else 0.0,
                    "ticks_first": self.ticks_first,
                    "ticks_stop": ticks_at_stop,
                }
            )
        )


WorkFn = Callable[[dict[str, Any], Recorder], Awaitable[None]]


def worker_main(work: WorkFn) -> None:
    """A worker process: `<adapter> worker '<json options>'`.

    Runs the system's worker until SIGTERM (or `stop_after` jobs), then writes
    what its handler saw to options["out"]. `work` returns once the system's
    worker stopped gracefully after recorder.stop was set.
    """
    options = json.loads(sys.argv[2])
    gate = options.get("gate")
    recorder = Recorder(
        stop_after=options.get("stop_after"),
        capacity=options.get("capacity"),
        ready_file=Path(options["out"] + ".ready") if gate else None,
    )
    snapshot: dict[str, Any] = {}

    def stop() -> None:
        # Snapshot at the stop request: CPU spent afterwards is shutdown, not jobs.
        snapshot.setdefault("cpu", cpu_seconds())
        snapshot.setdefault("ticks", machine_ticks())
        recorder.stop.set()

    async def run() -> None:
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop)
        watcher = asyncio.create_task(recorder.stop.wait())
        watcher.add_done_callback(lambda _: stop())
        opener = asyncio.create_task(open_gate(Path(gate), recorder.go)) if gate else None
        await work(options, recorder)
        if opener is not None:
            opener.cancel()

    asyncio.run(run())
    recorder.dump(Path(options["out"]), snapshot["cpu"], snapshot["ticks"])


async def open_gate(gate: Path, go: asyncio.Event) -> None:
    while not gate.exists():
        await asyncio.sleep(0.002)
    go.set()


@dataclass
class Workers:
    """Worker processes of one case, started with this adapter's interpreter."""

    script: str
    workdir: Path
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    gate: Path | None = None

    def start(self, count: int, gate: bool = False, **options: Any) -> None:
        self.gate = self.workdir / "go" if gate else None
        for index in range(count):
            out = self.workdir / f"seen-{index}.json"
            opts = {**options, "out": str(out), "gate": str(self.gate) if gate else None}
            self.procs.append(
                subprocess.Popen([sys.executable, self.script, "worker", json.dumps(opts)])
            )

    async def open_gate(self, timeout: float = 120.0) -> None:
        """Once every process holds its first jobs, let them all run."""
        if self.gate is None:
            return
        deadline = time.monotonic() + timeout
        while len(list(self.workdir.glob("seen-*.json.ready"))) < len(self.procs):
            if time.monotonic() > deadline or not self.alive():
                raise SystemExit("worker processes never became ready")
            await asyncio.sleep(0.01)
        self.gate.touch()

    def alive(self) -> bool:
        return any(p.poll() is None for p in self.procs)

    def stop(self, timeout: float = 120.0) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            if proc.wait(timeout) != 0:
                raise SystemExit(f"worker process exited with {proc.returncode}")

    def records(self) -> list[dict[str, Any]]:
        return [json.loads(p.read_text()) for p in sorted(self.workdir.glob("seen-*.json"))]


def drain_summary(records: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Jobs/s from the first handler start to the last handler finish over all
    worker processes, CPU per job, and machine CPU busy % over the same span."""
    jobs = sum(len(r["seqs"]) for r in records)
    ran = [r for r in records if r["first_start"] is not None]
    if not ran:
        return {"jobs": 0, "rate": 0.0}
    first = min(r["first_start"] for r in ran)
    last = max(r["last_finish"] for r in ran)
    cpu = sum(r["cpu_s"] for r in ran)
    busy0, total0 = min((r["ticks_first"] for r in ran), key=lambda t: t[1])
    busy1, total1 = max((r["ticks_stop"] for r in ran), key=lambda t: t[1])
    return {
        "jobs": jobs,
        "seconds": last - first,
        "rate": jobs / (last - first),
        "cpu_us_per_job": 1e6 * cpu / jobs,
        "machine_busy_pct": 100.0 * (busy1 - busy0) / max(total1 - total0, 1),
        # Every process's CPU per job over the same span: the workers', PostgreSQL's
        # (its backends, WAL writer, ...) and the driver's probe. The CPUs allow at
        # most cpus / this jobs per second, whatever the pipelining.
        "machine_cpu_us_per_job": 1e6 * (busy1 - busy0) / CLOCK_TICKS / jobs,
    }


def write_ledger(
    workdir: Path,
    *,
    produced: Sequence[int] = (),
    pending_before: Sequence[int] = (),
    pending_after: Sequence[int] = (),
) -> None:
    """What the driver checks against the workers' seen-*.json: every job that was
    produced or pending at the start either ran exactly once or is still pending,
    never both, never twice."""
    (workdir / "ledger.json").write_text(
        json.dumps(
            {
                "produced": list(produced),
                "pending_before": list(pending_before),
                "pending_after": list(pending_after),
            }
        )
    )


def emit(result: dict[str, Any]) -> None:
    """The adapter's answer: one JSON line, the last on stdout."""
    print(json.dumps(result), flush=True)


def with_search_path(dsn: str, schema: str) -> str:
    """The DSN with the peer's schema first on the search path, so peers whose SQL
    is unqualified install into and use a schema of their own."""
    return make_conninfo(dsn, options=f"-c search_path={schema}")
