"""Two Workers with install_signal_handlers=True on one loop, run by
tests/test_worker_edges.py in a process of its own (it signals itself).

Argument: the schema (migrated). One SIGTERM must stop both, gracefully; the
process must still be handled (not killed) by a signal while one runs on.
Prints "ok" and exits 0 when it was so.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys

import leaseq

app = leaseq.App(schema=sys.argv[1])
app.task("first")(lambda job: None)
app.task("second")(lambda job: None)


async def main() -> None:
    workers = [
        leaseq.Worker(app, queues=[name], maintenance=False, shutdown_grace=1)
        for name in ("first", "second")
    ]
    runs = [asyncio.create_task(w.run(install_signal_handlers=True)) for w in workers]
    while not all(w._claims is not None for w in workers):  # both started
        await asyncio.sleep(0.05)
    os.kill(os.getpid(), signal.SIGTERM)
    _, running = await asyncio.wait(runs, timeout=20)
    if running:
        print(f"{len(running)} of the workers did not stop on SIGTERM")
        sys.exit(1)
    # Both ended: the loop's handlers are gone with the last, not with the first.
    loop = asyncio.get_running_loop()
    if loop.remove_signal_handler(signal.SIGTERM):
        print("a handler was left behind")
        sys.exit(1)
    print("ok")


asyncio.run(main())
