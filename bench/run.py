"""The side-by-side bench: leaseq, procrastinate and pgqueuer on the same
PostgreSQL in the same run, with the raw psycopg ceilings beside them.

    make bench          # ~10 minutes: three interleaved repetitions
    make bench-quick    # ~2 minutes: one repetition, smaller sizes
    make bench-soak     # W5: 10 minutes at half the W2 c=10 rate (SOAK_SECONDS)

DATABASE_URL (or --database-url) names the server; the bench works in a database
of its own, leaseq_bench, created if missing. Without either, leaseq's embedded
server is started (leaseq.database_url). Results: bench/results/latest.{json,md,png}.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import time
from typing import Any

from harness import plan, report
from harness.machine import describe
from harness.runner import BenchFailed, drop_bench_schemas, ensure_database, run_step
from harness.venvs import BENCH, python_of

import leaseq

RESULTS = BENCH / "results"


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mode", choices=("quick", "full", "soak"), default="quick")
    parser.add_argument("--database-url", default=None)
    parser.add_argument("--soak-seconds", type=float, default=600.0)
    parser.add_argument("--database", default="leaseq_bench")
    parser.add_argument(
        "--only",
        default=None,
        help="comma-separated workloads (w2_c10,w3,...): a partial run, saved beside "
        "the results but never as latest",
    )
    parser.add_argument(
        "--systems", default=None, help="comma-separated systems (leaseq,pgqueuer,raw,...)"
    )
    return parser.parse_args()


def steps_for(args: argparse.Namespace) -> list[plan.Step]:
    steps = plan.soak_plan(args.soak_seconds) if args.mode == "soak" else plan.bench_plan(args.mode)
    if args.only:
        workloads = set(args.only.split(","))
        # A backlog's load goes with the drain that reads it (w4_load with w4).
        steps = [s for s in steps if s.workload.removesuffix("_load") in workloads]
    if args.systems:
        systems = set(args.systems.split(","))
        steps = [s for s in steps if s.system in systems]
    return steps


def partial(args: argparse.Namespace) -> bool:
    return bool(args.only or args.systems)


def params_for(step: plan.Step, runs: list[dict[str, Any]]) -> plan.Step:
    """The soak's rate is a fraction of the capacity measured earlier in this run."""
    fraction = step.params.get("rate_fraction")
    if fraction is None:
        return step
    capacity = [r["result"]["rate"] for r in runs if r["workload"] == "w2_c10"]
    params = {k: v for k, v in step.params.items() if k != "rate_fraction"}
    params["rate"] = round(fraction * max(capacity), 1)
    return plan.Step(step.workload, step.system, params, step.rep, step.reported)


def save(doc: dict[str, Any]) -> None:
    RESULTS.mkdir(exist_ok=True)
    doc["summary"] = report.summarise(doc["runs"])
    text = json.dumps(doc, indent=1)
    stem = "latest" if doc["mode"] != "soak" else "latest-soak"
    (RESULTS / f"results-{doc['mode']}-{doc['started']}.json").write_text(text)
    if doc.get("partial"):
        return  # a partial run never stands in for the whole table
    (RESULTS / f"{stem}.json").write_text(text)
    (RESULTS / f"{stem}.md").write_text(report.markdown(doc))


def plot(doc: dict[str, Any]) -> None:
    """The chart, drawn by bench/plot.py in a venv of its own (matplotlib stays out
    of the dev install); a failure to draw is reported, never fatal."""
    stem = "latest" if doc["mode"] != "soak" else "latest-soak"
    try:
        subprocess.run(
            [str(python_of("plot")), str(BENCH / "plot.py"), str(RESULTS / f"{stem}.json")],
            check=True,
        )
    except (subprocess.CalledProcessError, OSError) as error:
        print(f"bench: no chart ({error})", file=sys.stderr)


def main() -> int:
    args = parse()
    url = leaseq.database_url(args.database_url or os.environ.get("DATABASE_URL"))
    dsn = ensure_database(url, args.database)
    steps = steps_for(args)
    for system in {s.system for s in steps} - {"leaseq", "raw"}:
        python_of(system)  # build the peers' venvs before the clock matters
    drop_bench_schemas(dsn)
    started = datetime.datetime.now(datetime.UTC).strftime("%Y%m%dT%H%M%SZ")
    doc: dict[str, Any] = {
        "mode": args.mode,
        "started": started,
        "machine": describe(dsn),
        "reps": plan.SIZES[args.mode].reps if args.mode in plan.SIZES else 1,
        "backlog": plan.SIZES[args.mode].w4_backlog if args.mode in plan.SIZES else 0,
        "runs": [],
        "checked_only": [],
        "partial": partial(args),
    }
    origin = time.monotonic()
    try:
        for index, planned in enumerate(steps, 1):
            step = params_for(planned, doc["runs"])
            result = run_step(step, dsn)
            entry = {
                "workload": step.workload,
                "system": step.system,
                "rep": step.rep,
                "params": step.params,
                "result": result,
            }
            doc["runs" if step.reported else "checked_only"].append(entry)
            shown = {k: round(v, 1) for k, v in result.items() if isinstance(v, float)}
            print(
                f"[{time.monotonic() - origin:6.0f}s {index}/{len(steps)}] {step.label}: "
                f"{shown} exactly-once ok ({result['exactly_once']['expected']:,} jobs)",
                flush=True,
            )
    except BenchFailed as error:
        doc["failed"] = str(error)
        save(doc)
        print(f"\nBENCH FAILED: {error}", file=sys.stderr)
        return 1
    finally:
        drop_bench_schemas(dsn)
    save(doc)
    if not doc["partial"]:
        plot(doc)
    print()
    print(report.markdown({**doc, "summary": report.summarise(doc["runs"])}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
