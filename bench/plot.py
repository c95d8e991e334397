"""The chart of a results JSON: throughput per workload (log scale, median with
min-max bars) and W3's start latencies, one colour per system.

    bench/.venvs/plot/bin/python bench/plot.py bench/results/latest.json

Run in bench/.venvs/plot (matplotlib stays out of the dev install); writes the
PNG beside the JSON.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

SYSTEMS = ("leaseq", "procrastinate", "pgqueuer", "raw")
COLOURS = {"leaseq": "#1f77b4", "procrastinate": "#ff7f0e", "pgqueuer": "#2ca02c", "raw": "#7f7f7f"}
ROWS = [
    ("w1_one", "W1 one/tx", "w1_one"),
    ("w1_bulk", "W1 bulk", "w1_bulk"),
    ("w2_c1", "W2 c=1", "w2_c1"),
    ("w2_c10", "W2 c=10", "raw_b100"),
    ("w2_c50", "W2 c=50", "raw_b100"),
    ("w2_2p", "W2 2x10", "raw_b100_2p"),
    ("w4", "W4 backlog", None),
    ("w4_1m", "W4 1M", None),
]


def cell(summary: dict[str, Any], workload: str | None, system: str, metric: str) -> Any:
    return summary.get(workload or "", {}).get(system, {}).get(metric)


def bars(
    ax: Any, summary: dict[str, Any], rows: list[tuple[str, str, str | None]], metric: str
) -> None:
    width = 0.8 / len(SYSTEMS)
    for k, system in enumerate(SYSTEMS):
        xs, ys, lo, hi = [], [], [], []
        for i, (workload, _, ceiling) in enumerate(rows):
            c = cell(summary, ceiling if system == "raw" else workload, system, metric)
            if c is None:
                continue
            xs.append(i + (k - 1.5) * width)
            ys.append(c["median"])
            lo.append(c["median"] - c["min"])
            hi.append(c["max"] - c["median"])
        if xs:
            ax.bar(xs, ys, width, yerr=[lo, hi], label=system, color=COLOURS[system], capsize=2)
    ax.set_xticks(range(len(rows)), [title for _, title, _ in rows], rotation=20)


def soak(doc: dict[str, Any], path: Path) -> None:
    """W5: the worker's RSS and the tables' size over the soak."""
    (run,) = [r for r in doc["runs"] if r["workload"] == "w5"]
    samples, warmup = run["result"]["samples"], run["result"]["warmup_s"]
    fig, (rss, size) = plt.subplots(1, 2, figsize=(12, 4))
    t = [s["t"] for s in samples]
    rss.plot(t, [s["rss_kib"] / 1024 for s in samples], color=COLOURS["leaseq"])
    rss.set_ylabel("worker VmRSS (MiB)")
    size.plot(t, [s["bytes"] / 2**20 for s in samples], color=COLOURS["leaseq"])
    size.set_ylabel("tables + indexes (MiB)")
    for ax in (rss, size):
        ax.axvline(warmup, color="grey", linestyle=":", label="end of warm-up")
        ax.set_xlabel("s")
        ax.set_ylim(bottom=0)
        ax.legend()
    fig.suptitle(f"leaseq soak at {run['result']['offered_rate']:,.0f} jobs/s, {doc['started']}")
    fig.tight_layout()
    fig.savefig(path.with_suffix(".png"), dpi=110)
    print(f"bench: chart written to {path.with_suffix('.png')}")


def main() -> None:
    path = Path(sys.argv[1])
    doc = json.loads(path.read_text())
    if any(r["workload"] == "w5" for r in doc["runs"]):
        soak(doc, path)
        return
    summary = doc["summary"]
    rows = [r for r in ROWS if r[0] in summary]
    fig, (left, right) = plt.subplots(1, 2, figsize=(14, 5), width_ratios=(3, 1))
    if rows:
        bars(left, summary, rows, "rate")
        left.set_yscale("log")
        left.set_ylabel("jobs/s (log)")
        left.set_title("throughput; raw = the psycopg ceiling of the row")
        left.legend()
    latency = [(m, m[:-3], None) for m in ("p50_ms", "p95_ms", "p99_ms", "max_ms")]
    if "w3" in summary:
        for k, system in enumerate(SYSTEMS[:3]):
            ys = [cell(summary, "w3", system, m) for m, _, _ in latency]
            xs = [i + (k - 1) * 0.25 for i in range(len(latency))]
            right.bar(
                xs, [y["median"] if y else 0 for y in ys], 0.25, color=COLOURS[system], label=system
            )
        right.set_xticks(range(len(latency)), [t for _, t, _ in latency])
        right.set_ylabel("ms")
        right.set_title("W3 start latency, 200 jobs/s")
    fig.suptitle(f"leaseq side-by-side bench, {doc['mode']}, {doc['started']}")
    fig.tight_layout()
    out = path.with_suffix(".png")
    fig.savefig(out, dpi=110)
    print(f"bench: chart written to {out}")


if __name__ == "__main__":
    main()
