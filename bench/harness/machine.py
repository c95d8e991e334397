"""What the numbers were measured on: they mean little without it."""

from __future__ import annotations

import os
import platform
from typing import Any

import psycopg


def describe(dsn: str) -> dict[str, Any]:
    model = "unknown"
    with open("/proc/cpuinfo") as cpuinfo:
        for line in cpuinfo:
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    with open("/proc/meminfo") as meminfo:
        ram_kib = int(meminfo.readline().split()[1])
    with psycopg.connect(dsn, autocommit=True) as conn:
        settings = {
            name: str(conn.execute(f"SHOW {name}").fetchone()[0])  # type: ignore[index]
            for name in (
                "server_version",
                "fsync",
                "synchronous_commit",
                "shared_buffers",
                "autovacuum",
                "max_connections",
            )
        }
    return {
        "cpus": os.cpu_count(),
        "cpu_model": model,
        "ram_gib": round(ram_kib / 2**20, 1),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "postgres": settings,
    }


def one_line(machine: dict[str, Any]) -> str:
    pg = machine["postgres"]
    return (
        f"{machine['cpus']} x {machine['cpu_model']}, {machine['ram_gib']} GiB RAM; "
        f"PostgreSQL {pg['server_version']} (fsync={pg['fsync']}, "
        f"synchronous_commit={pg['synchronous_commit']}, shared_buffers={pg['shared_buffers']}, "
        f"autovacuum={pg['autovacuum']})"
    )
