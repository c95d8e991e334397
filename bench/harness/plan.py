"""What each mode runs, in which order.

Repetitions are interleaved across systems (rep 1: A B C D, rep 2: B C D A, ...)
so that a noisy minute on the shared machine hits every system, not one. The
W4 backlogs are loaded once, before the repetitions, into schemas of their own
(the other workloads reset the systems' main schemas); each repetition then
drains one window from them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

PEERS = ("leaseq", "procrastinate", "pgqueuer")
#: leaseq's opt-in Worker(durable_acknowledgements=False), measured beside its default.
ASYNC_ACKS = {"durable_acknowledgements": False}
#: leaseq's claim and completion statements run back to back with no Worker (a
#: ceiling beside the drains at the same batch size, not a system of its own).
STATEMENTS = {"statements_only": True}


@dataclass(frozen=True)
class Sizes:
    reps: int
    w1_one: int  # jobs enqueued one per transaction
    w1_bulk: int  # jobs enqueued 1,000 per call
    w2: int  # jobs pre-loaded per drain (concurrency 10, 50, two processes)
    w2_c1: int  # at concurrency 1 (a no-op cycle per job: the slowest drain)
    w3_seconds: float
    w4_backlog: int
    w4_window: int
    leaseq_1m: bool
    notify_jobs: int


SIZES = {
    "quick": Sizes(1, 1000, 20_000, 5_000, 1_000, 5, 100_000, 5_000, False, 1000),
    "full": Sizes(3, 2000, 50_000, 20_000, 2_000, 20, 500_000, 10_000, True, 2000),
}


@dataclass(frozen=True)
class Step:
    workload: str  # the row of the results table
    system: str  # leaseq, procrastinate, pgqueuer or raw (the adapter that runs it)
    params: dict[str, Any] = field(default_factory=dict)
    rep: int = 0
    reported: bool = True  # a backlog's load is checked, not reported

    @property
    def label(self) -> str:
        return f"rep {self.rep + 1} {self.workload} {self.system}"


def backlog_schema(system: str, jobs: int) -> str:
    return f"bench_{system}_backlog_{jobs // 1000}k"


def one_rep(s: Sizes) -> list[list[Step]]:
    """The workloads of one repetition; each inner list is one workload's systems,
    rotated per repetition by the caller."""
    drain = {"case": "drain", "jobs": s.w2}
    # The batched raw loop drains 20,000 jobs in a few tenths of a second, too short
    # a span to time against process start-up jitter: it gets five times the jobs.
    raw_drain = {"case": "drain", "jobs": 5 * s.w2}
    latency = {"case": "latency", "rate": 200, "seconds": s.w3_seconds, "concurrency": 10}
    groups = [
        [Step("w1_one", n, {"case": "enqueue", "jobs": s.w1_one}) for n in (*PEERS, "raw")],
        [
            Step("w1_bulk", n, {"case": "enqueue", "jobs": s.w1_bulk, "batch": 1000})
            for n in (*PEERS, "raw")
        ],
        [
            Step("w2_c1", n, {"case": "drain", "jobs": s.w2_c1, "concurrency": 1})
            for n in (*PEERS, "raw")
        ],
        [
            *(Step("w2_c10", n, {**drain, "concurrency": 10}) for n in PEERS),
            Step("raw_b100", "raw", {**raw_drain, "concurrency": 100}),
            # leaseq's opt-in, beside its default in the same rotation (not a target row).
            Step("w2_c10_async_acks", "leaseq", {**drain, **ASYNC_ACKS, "concurrency": 10}),
            # leaseq's own statements with no worker: the most they allow (a limit).
            Step("w2_c10_statements", "leaseq", {**drain, **STATEMENTS, "concurrency": 10}),
        ],
        [
            *(Step("w2_c50", n, {**drain, "concurrency": 50}) for n in PEERS),
            Step("w2_c50_async_acks", "leaseq", {**drain, **ASYNC_ACKS, "concurrency": 50}),
            Step("w2_c50_statements", "leaseq", {**drain, **STATEMENTS, "concurrency": 50}),
        ],
        [
            *(Step("w2_2p", n, {**drain, "concurrency": 10, "processes": 2}) for n in PEERS),
            Step("raw_b100_2p", "raw", {**raw_drain, "concurrency": 100, "processes": 2}),
        ],
        [
            *(Step("w3", n, latency) for n in PEERS),
            # The floor: a LISTEN-woken raw claim loop, notified by the producer's INSERT.
            Step("w3", "raw", {**latency, "notify": True}),
        ],
        [
            Step(
                "w4",
                n,
                {
                    "case": "backlog_window",
                    "schema": backlog_schema(n, s.w4_backlog),
                    "window": s.w4_window,
                    "concurrency": 10,
                },
            )
            for n in PEERS
        ],
    ]
    if s.leaseq_1m:
        params = {"case": "backlog_window", "schema": backlog_schema("leaseq", 1_000_000)}
        groups.append(
            [Step("w4_1m", "leaseq", {**params, "window": s.w4_window, "concurrency": 10})]
        )
    for producers in (1, 4, 16):
        groups.append(
            [
                Step(
                    f"notify_p{producers}_{'on' if notify else 'off'}",
                    system,
                    {
                        "case": "producers",
                        "jobs": s.notify_jobs,
                        "producers": producers,
                        "notify": notify,
                    },
                )
                for system in ("raw", "leaseq")
                for notify in (False, True)
            ]
            + [
                Step(
                    f"notify_p{producers}_waiting",
                    "leaseq",
                    {
                        "case": "producers",
                        "jobs": s.notify_jobs,
                        "producers": producers,
                        "notify": True,
                        "waiting": True,
                    },
                )
            ]
        )
    return groups


def loads(s: Sizes) -> list[Step]:
    steps = [
        Step(
            "w4_load",
            n,
            {
                "case": "backlog_load",
                "jobs": s.w4_backlog,
                "schema": backlog_schema(n, s.w4_backlog),
            },
            reported=False,
        )
        for n in PEERS
    ]
    if s.leaseq_1m:
        jobs = 1_000_000
        schema = backlog_schema("leaseq", jobs)
        params = {"case": "backlog_load", "jobs": jobs, "schema": schema}
        steps.append(Step("w4_1m_load", "leaseq", params, reported=False))
    return steps


def bench_plan(mode: str) -> list[Step]:
    sizes = SIZES[mode]
    steps = loads(sizes)
    for rep in range(sizes.reps):
        for group in one_rep(sizes):
            k = rep % len(group)
            for step in group[k:] + group[:k]:
                steps.append(Step(step.workload, step.system, step.params, rep))
    return steps


def soak_plan(seconds: float) -> list[Step]:
    """W5: measure leaseq's W2 c=10 capacity now, then soak at half of it (the
    driver fills in the rate from the first step's result)."""
    drain = Step("w2_c10", "leaseq", {"case": "drain", "jobs": 20_000, "concurrency": 10})
    soak = Step(
        "w5",
        "leaseq",
        {
            "case": "soak",
            "seconds": seconds,
            "warmup": min(60.0, seconds / 4),
            "sample_every": 5.0,
            "retain_done": 30.0,
            "concurrency": 10,
            "rate_fraction": 0.5,
        },
    )
    return [drain, soak]
