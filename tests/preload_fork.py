"""A web server's preload pattern, run by tests/test_pools.py in a process of its
own: a module-level Queue used before the server forks its children, then
used by each child and by the parent at once.

Argument: the schema (migrated). Exit 0 with "ok" when every child's enqueues
came back as its own jobs; otherwise what went wrong.
"""

from __future__ import annotations

import os
import sys
import threading

import leaseq

CHILDREN, JOBS = 4, 25

queue = leaseq.Queue(schema=sys.argv[1], metrics=None)
queue.enqueue("preload", {"who": "parent"})  # used before the fork: its pool is open


def child(number: int) -> int:
    for n in range(JOBS):
        job_id = queue.enqueue("preload", {"child": number, "n": n})
        payload = queue.get(job_id).payload
        if payload != {"child": number, "n": n}:
            print(f"child {number}: enqueue returned job {job_id}, which is {payload}")
            return 1
    return 0


def parent_meanwhile(stop: threading.Event, errors: list[BaseException]) -> None:
    while not stop.is_set():
        try:
            queue.stats("preload")
        except BaseException as exc:
            errors.append(exc)
            return


pids = []
for number in range(CHILDREN):
    pid = os.fork()
    if pid == 0:
        code = 2
        try:
            code = child(number)
        except BaseException as exc:
            print(f"child {number}: {exc!r}")
        finally:
            sys.stdout.flush()
            os._exit(code)
    pids.append(pid)

stop, errors = threading.Event(), []
meanwhile = threading.Thread(target=parent_meanwhile, args=(stop, errors))
meanwhile.start()
codes = [os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) for pid in pids]
stop.set()
meanwhile.join()
queue.enqueue("preload", {"who": "parent, after"})  # the parent's pool still works
if codes != [0] * CHILDREN or errors:
    print(f"children exited {codes}; the parent's errors: {errors!r}")
    sys.exit(1)
print("ok")
