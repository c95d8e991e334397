"""The exactly-once check, run by the driver on what each run left behind.

Each worker process writes the sequence numbers its handler started
(seen-*.json); the adapter writes what was produced, what was pending before the
run and what is pending after it (ledger.json). Every job produced or pending
before must have run exactly once or still be pending, never both, never twice.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path


class ExactlyOnceError(Exception):
    pass


def sample(values: set[int] | list[int], limit: int = 10) -> str:
    return ", ".join(str(v) for v in sorted(values)[:limit]) + (
        " ..." if len(values) > limit else ""
    )


def verify(workdir: Path) -> dict[str, int]:
    ledger = json.loads((workdir / "ledger.json").read_text())
    seen: Counter[int] = Counter()
    for path in sorted(workdir.glob("seen-*.json")):
        seen.update(json.loads(path.read_text())["seqs"])
    after = Counter(ledger["pending_after"])
    expected = set(ledger["produced"]) | set(ledger["pending_before"])
    problems = []
    if twice := [s for s, n in seen.items() if n > 1]:
        problems.append(f"{len(twice)} jobs ran more than once: {sample(twice)}")
    if doubled := [s for s, n in after.items() if n > 1]:
        problems.append(f"{len(doubled)} jobs are pending more than once: {sample(doubled)}")
    if both := set(seen) & set(after):
        problems.append(f"{len(both)} jobs ran and are still pending: {sample(both)}")
    accounted = set(seen) | set(after)
    if lost := expected - accounted:
        problems.append(f"{len(lost)} jobs neither ran nor are pending (lost): {sample(lost)}")
    if extra := accounted - expected:
        problems.append(
            f"{len(extra)} jobs ran or are pending but were never produced: {sample(extra)}"
        )
    if problems:
        raise ExactlyOnceError("; ".join(problems))
    return {"ran": sum(seen.values()), "pending": sum(after.values()), "expected": len(expected)}
