"""A Worker with install_signal_handlers=True embedded in an application that has
its own SIGTERM and SIGINT handlers, run by tests/test_worker_edges.py in a
process of its own (it signals itself).

Argument: the schema (migrated). While the Worker runs, SIGTERM stops it
gracefully (the application's handler is not called); once it ended, the
application's own handlers are back: its loop callback for SIGTERM, its
process handler for SIGINT. Prints "ok" and exits 0 when it was so.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from types import FrameType

import leaseq

app = leaseq.App(schema=sys.argv[1])
app.task("reports")(lambda job: None)
seen: list[str] = []


def on_sigint(signum: int, frame: FrameType | None) -> None:
    seen.append("application SIGINT")


async def main() -> None:
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, seen.append, "application SIGTERM")
    signal.signal(signal.SIGINT, on_sigint)
    worker = leaseq.Worker(app, maintenance=False, shutdown_grace=1)
    running = asyncio.create_task(worker.run(install_signal_handlers=True))
    while worker._claims is None:  # started
        await asyncio.sleep(0.05)
    os.kill(os.getpid(), signal.SIGTERM)
    await asyncio.wait_for(running, 20)
    if seen:
        print(f"the application's handler ran while the worker held the signal: {seen}")
        sys.exit(1)
    os.kill(os.getpid(), signal.SIGTERM)
    os.kill(os.getpid(), signal.SIGINT)
    for _ in range(100):
        if len(seen) == 2:
            break
        await asyncio.sleep(0.02)
    if sorted(seen) != ["application SIGINT", "application SIGTERM"]:
        print(f"the application's handlers were not put back: {seen}")
        sys.exit(1)
    print("ok")


asyncio.run(main())
