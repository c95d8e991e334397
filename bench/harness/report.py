"""Medians (with min and max) over the repetitions, the ratios, the markdown."""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Callable
from typing import Any

from .machine import one_line

PEERS = ("leaseq", "procrastinate", "pgqueuer")
# Which raw ceiling each throughput row is held against, and how it is described.
THROUGHPUT = [
    ("w1_one", "W1 enqueue, one job per transaction", "w1_one", "INSERT per transaction"),
    ("w1_bulk", "W1 enqueue, bulk (1,000 per call)", "w1_bulk", "COPY, 1,000 rows per call"),
    ("w2_c1", "W2 drain, concurrency 1", "w2_c1", "claim/complete 1 per statement"),
    ("w2_c10", "W2 drain, concurrency 10", "raw_b100", "claim/complete 100 per statement"),
    ("w2_c50", "W2 drain, concurrency 50", "raw_b100", "claim/complete 100 per statement"),
    ("w2_2p", "W2 drain, 2 processes x 10", "raw_b100_2p", "100 per statement, 2 processes"),
    ("w4", "W4 drain c=10, big backlog", "raw_b100", "claim/complete 100 per statement"),
    ("w4_1m", "W4 drain c=10, 1,000,000 queued", "raw_b100", "claim/complete 100 per statement"),
]
METRICS = (
    "rate",
    "p50_ms",
    "p95_ms",
    "p99_ms",
    "max_ms",
    "cpu_us_per_job",
    "machine_busy_pct",
    "machine_cpu_us_per_job",
)
# The drain targets of issue 11: (workload, what the target is, processes, its rate).
TARGETS: list[tuple[str, str, int, Callable[[dict[str, Any]], float | None]]] = [
    ("w2_c1", "≥ best peer", 1, lambda s: best_peer(s, "w2_c1", "rate")),
    ("w2_c10", "≥ 2 x best peer", 1, lambda s: _times(2, best_peer(s, "w2_c10", "rate"))),
    ("w2_c50", "≥ 2 x best peer", 1, lambda s: _times(2, best_peer(s, "w2_c50", "rate"))),
    ("w2_2p", "≥ 0.5 x raw", 2, lambda s: _times(0.5, med(s, "raw_b100_2p", "raw", "rate"))),
]


def summarise(runs: list[dict[str, Any]]) -> dict[str, dict[str, dict[str, dict[str, float]]]]:
    """summary[workload][system][metric] = {median, min, max, n}."""
    values: dict[tuple[str, str, str], list[float]] = defaultdict(list)
    for run in runs:
        for metric in METRICS:
            if metric in run["result"]:
                values[run["workload"], run["system"], metric].append(run["result"][metric])
    summary: dict[str, dict[str, dict[str, dict[str, float]]]] = defaultdict(
        lambda: defaultdict(dict)
    )
    for (workload, system, metric), vs in values.items():
        summary[workload][system][metric] = {
            "median": statistics.median(vs),
            "min": min(vs),
            "max": max(vs),
            "n": len(vs),
        }
    return {w: dict(s) for w, s in summary.items()}


def med(summary: dict[str, Any], workload: str, system: str, metric: str) -> float | None:
    cell = summary.get(workload, {}).get(system, {}).get(metric)
    return None if cell is None else cell["median"]


def fmt(cell: dict[str, float] | None, digits: int = 0) -> str:
    if cell is None:
        return "-"
    body = f"{cell['median']:,.{digits}f}"
    if cell["n"] > 1:
        body += f" ({cell['min']:,.{digits}f}-{cell['max']:,.{digits}f})"
    return body


def ratio(a: float | None, b: float | None) -> str:
    return "-" if a is None or b is None or b == 0 else f"{a / b:.2f}"


def best_peer(
    summary: dict[str, Any], workload: str, metric: str, lower: bool = False
) -> float | None:
    vs = [v for p in PEERS[1:] if (v := med(summary, workload, p, metric)) is not None]
    if not vs:
        return None
    return min(vs) if lower else max(vs)


def _times(factor: float, value: float | None) -> float | None:
    return None if value is None else factor * value


def budget_table(summary: dict[str, Any], cpus: int) -> list[str]:
    """What the CPU allows: a drain cannot run faster than the machine's CPUs
    divided by the CPU all processes spend per job, nor faster than its worker
    processes (one core each, the GIL) divided by the worker's CPU per job,
    however well it overlaps its claims with its handlers. Each at the cost per
    job measured in this run."""
    lines = [
        f"| drain (CPU budget, {cpus} CPUs) | leaseq jobs/s | target | target jobs/s | "
        "machine CPU µs/job: leaseq / pgqueuer | the CPUs allow | worker CPU µs/job | "
        "its processes allow | target ÷ the lower bound |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for workload, goal, processes, target_of in TARGETS:
        machine = med(summary, workload, "leaseq", "machine_cpu_us_per_job")
        worker = med(summary, workload, "leaseq", "cpu_us_per_job")
        target = target_of(summary)
        if machine is None or worker is None or target is None:
            continue
        peer = med(summary, workload, "pgqueuer", "machine_cpu_us_per_job")
        by_cpus, by_processes = cpus * 1e6 / machine, processes * 1e6 / worker
        lines.append(
            f"| {workload} | {med(summary, workload, 'leaseq', 'rate'):,.0f} | {goal} | "
            f"{target:,.0f} | {machine:,.0f} / {'-' if peer is None else f'{peer:,.0f}'} | "
            f"{by_cpus:,.0f} | {worker:,.0f} | {by_processes:,.0f} | "
            f"{target / min(by_cpus, by_processes):.2f} |"
        )
    return lines


def throughput_table(summary: dict[str, Any]) -> list[str]:
    lines = [
        "| workload (jobs/s) | leaseq | procrastinate | pgqueuer | raw ceiling | "
        "leaseq ÷ best peer | leaseq ÷ raw | best peer ÷ raw |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for workload, title, ceiling, how in THROUGHPUT:
        if workload not in summary:
            continue
        cells = [fmt(summary[workload].get(p, {}).get("rate")) for p in PEERS]
        raw = summary.get(ceiling, {}).get("raw", {}).get("rate")
        ours, peer = med(summary, workload, "leaseq", "rate"), best_peer(summary, workload, "rate")
        raw_median = None if raw is None else raw["median"]
        lines.append(
            f"| {title} | {' | '.join(cells)} | {fmt(raw)} ({how}) | {ratio(ours, peer)} | "
            f"{ratio(ours, raw_median)} | {ratio(peer, raw_median)} |"
        )
    return lines


def latency_table(summary: dict[str, Any]) -> list[str]:
    if "w3" not in summary:
        return []
    lines = [
        "| W3 start latency (ms), 200 jobs/s, c=10 | leaseq | procrastinate | pgqueuer | "
        "raw floor (LISTEN-woken claim) | leaseq ÷ best peer (lower is better) | "
        "leaseq ÷ raw floor |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for metric in ("p50_ms", "p95_ms", "p99_ms", "max_ms"):
        cells = [fmt(summary["w3"].get(p, {}).get(metric), 1) for p in (*PEERS, "raw")]
        ours = med(summary, "w3", "leaseq", metric)
        lines.append(
            f"| {metric[:-3]} | {' | '.join(cells)} | "
            f"{ratio(ours, best_peer(summary, 'w3', metric, lower=True))} | "
            f"{ratio(ours, med(summary, 'w3', 'raw', metric))} |"
        )
    return lines


def cpu_table(summary: dict[str, Any]) -> list[str]:
    lines = [
        "| worker CPU per job (µs, user+sys) / machine CPU busy % | leaseq | procrastinate | "
        "pgqueuer | raw |",
        "| --- | --- | --- | --- | --- |",
    ]
    for workload, title, ceiling, _ in THROUGHPUT[2:]:
        if workload not in summary:
            continue
        for metric, name in (("cpu_us_per_job", "µs/job"), ("machine_busy_pct", "busy %")):
            cells = [fmt(summary[workload].get(p, {}).get(metric)) for p in PEERS]
            raw = fmt(summary.get(ceiling, {}).get("raw", {}).get(metric))
            lines.append(f"| {title}: {name} | {' | '.join(cells)} | {raw} |")
    return lines


def backlog_table(summary: dict[str, Any], backlog: int) -> list[str]:
    if "w4" not in summary:
        return []
    lines = [
        "| W4 ÷ W2 at concurrency 10 (a deep backlog's cost) | leaseq | procrastinate | pgqueuer |",
        "| --- | --- | --- | --- |",
    ]
    for workload, title in (("w4", f"{backlog:,} queued"), ("w4_1m", "1,000,000 queued")):
        if workload in summary:
            cells = [
                ratio(med(summary, workload, p, "rate"), med(summary, "w2_c10", p, "rate"))
                for p in PEERS
            ]
            lines.append(f"| {title} | {' | '.join(cells)} |")
    return lines


def notify_table(summary: dict[str, Any]) -> list[str]:
    if "notify_p1_on" not in summary:
        return []
    lines = [
        "| producers (one job per transaction, jobs/s) | raw | raw + pg_notify | ratio | "
        "leaseq notify=False | leaseq notify=True, no worker waits | ratio | "
        "leaseq notify=True, a worker waits | ratio |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for producers in (1, 4, 16):
        off, on = f"notify_p{producers}_off", f"notify_p{producers}_on"
        waiting = f"notify_p{producers}_waiting"
        row = [str(producers)]
        for system in ("raw", "leaseq"):
            row += [fmt(summary[off].get(system, {}).get("rate"))]
            row += [fmt(summary[on].get(system, {}).get("rate"))]
            row += [ratio(med(summary, on, system, "rate"), med(summary, off, system, "rate"))]
        row += [fmt(summary.get(waiting, {}).get("leaseq", {}).get("rate"))]
        row += [ratio(med(summary, waiting, "leaseq", "rate"), med(summary, off, "leaseq", "rate"))]
        lines.append(f"| {' | '.join(row)} |")
    return lines


def _leaseq_beside(
    summary: dict[str, Any], workload: str, variant: str
) -> tuple[list[dict[str, float] | None], list[float | None]]:
    """leaseq's rate in ``workload`` and in ``<workload>_<variant>``, run beside it in
    the same rotation: their cells, and their medians."""
    cells = [
        summary.get(w, {}).get("leaseq", {}).get("rate")
        for w in (workload, f"{workload}_{variant}")
    ]
    return cells, [None if c is None else c["median"] for c in cells]


def async_acks_table(summary: dict[str, Any]) -> list[str]:
    """leaseq's opt-in Worker(durable_acknowledgements=False), beside its default in
    the same rotation: what it buys, and where it puts leaseq against the peers."""
    lines = [
        "| leaseq's opt-in `durable_acknowledgements=False` (jobs/s) | durable (default) | "
        "opt-in | opt-in ÷ default | opt-in ÷ best peer |",
        "| --- | --- | --- | --- | --- |",
    ]
    for workload, title, _, _ in THROUGHPUT:
        if f"{workload}_async_acks" not in summary:
            continue
        cells, (default, fast) = _leaseq_beside(summary, workload, "async_acks")
        lines.append(
            f"| {title} | {' | '.join(fmt(c) for c in cells)} | {ratio(fast, default)} | "
            f"{ratio(fast, best_peer(summary, workload, 'rate'))} |"
        )
    return lines


def statements_table(summary: dict[str, Any]) -> list[str]:
    """leaseq's claim and completion with no Worker at the drain's batch size, beside
    the Worker and the target: a Worker cannot drain faster than its own statements
    run back to back, so a target above that rate is out of any worker's reach."""
    lines = [
        "| leaseq's statements alone, no Worker (jobs/s) | Worker | statements alone | "
        "Worker ÷ statements | target | target ÷ statements |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for workload, goal, _, target_of in TARGETS:
        if f"{workload}_statements" not in summary:
            continue
        cells, (worker, statements) = _leaseq_beside(summary, workload, "statements")
        target = target_of(summary)
        lines.append(
            f"| {workload} | {' | '.join(fmt(c) for c in cells)} | "
            f"{ratio(worker, statements)} | "
            f"{'-' if target is None else f'{goal}: {target:,.0f}'} | "
            f"{ratio(target, statements)} |"
        )
    return lines


def soak_table(runs: list[dict[str, Any]]) -> list[str]:
    soaks = [r["result"] for r in runs if r["workload"] == "w5"]
    if not soaks:
        return []
    s = soaks[0]
    return [
        f"W5 soak, leaseq: {s['jobs']:,} jobs offered at {s['offered_rate']:,.0f} jobs/s "
        f"(half the W2 c=10 rate measured just before; achieved {s['achieved_rate']:,.0f}) for "
        f"{s['seconds']:,.0f} s, retain_done=30 s, the maintenance leader on; "
        f"growth after a {s['warmup_s']:.0f} s warm-up:",
        "",
        "| metric | at warm-up end | at the end | growth per minute |",
        "| --- | --- | --- | --- |",
        f"| worker RSS (MiB) | {s['rss_mib_at_warmup']:.1f} | {s['rss_mib_end']:.1f} | "
        f"{s['rss_growth_mib_per_min']:+.2f} |",
        f"| tables + indexes (MiB) | {s['size_mib_at_warmup']:.1f} | {s['size_mib_end']:.1f} | "
        f"{s['size_growth_mib_per_min']:+.2f} |",
        "",
        f"Start latency p50 {s['p50_ms']:.1f} ms, p99 {s['p99_ms']:.1f} ms; "
        f"worker CPU {s['cpu_us_per_job']:.0f} µs/job.",
    ]


def markdown(doc: dict[str, Any]) -> str:
    summary, runs = doc["summary"], doc["runs"]
    reps = doc["reps"]
    parts = [
        f"### {doc['mode']} bench, {doc['started']}",
        "",
        f"Machine: {one_line(doc['machine'])}. {reps} repetition(s), interleaved across "
        f"systems; median (min-max). Every one of the {len(runs)} runs passed the "
        "exactly-once check (each job's sequence number ran once, or is still queued).",
        "",
    ]
    for table in (
        throughput_table(summary),
        latency_table(summary),
        cpu_table(summary),
        budget_table(summary, doc["machine"]["cpus"]),
        statements_table(summary),
        backlog_table(summary, doc.get("backlog", 0)),
        notify_table(summary),
        async_acks_table(summary),
        soak_table(runs),
    ):
        if len(table) > 2:
            parts += [*table, ""]
    return "\n".join(parts)
