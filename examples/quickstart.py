"""The report queue in miniature: the README's quickstart as one script (`make demo`
runs the full demo service, `leaseq demo`).

A "web request" saves a report request and its job in ONE transaction; worker
threads claim jobs, write the report and complete the job in ONE transaction,
so a report exists exactly once even when a worker crashes mid-job.
Uses DATABASE_URL when set, else leaseq's embedded PostgreSQL under .leaseq/.
"""

from __future__ import annotations

import threading
import time

import psycopg

import leaseq

SCHEMA = "leaseq_quickstart"
REPORTS = 40
WORKERS = 4
LEASE = 2.0  # seconds: short, so the crashed job comes back quickly


def setup(queue: leaseq.Queue) -> None:
    with psycopg.connect(queue.dsn, autocommit=True) as conn:
        conn.execute(f"DROP SCHEMA IF EXISTS {SCHEMA} CASCADE")
    queue.migrate()
    with psycopg.connect(queue.dsn, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE {SCHEMA}.report_request (id serial PRIMARY KEY, customer text)")
        conn.execute(
            f"CREATE TABLE {SCHEMA}.report (idempotency_key text PRIMARY KEY,"
            " request_id int NOT NULL, total bigint NOT NULL)"
        )


def submit(queue: leaseq.Queue, customer: str) -> None:
    """What an HTTP handler does: business row and job commit together."""
    with psycopg.connect(queue.dsn) as conn, conn.transaction():
        row = conn.execute(
            f"INSERT INTO {SCHEMA}.report_request (customer) VALUES (%s) RETURNING id",
            (customer,),
        ).fetchone()
        assert row is not None
        queue.enqueue("reports", {"request_id": row[0]}, conn=conn)


def generate(request_id: int) -> int:
    return sum(i * i % 7 for i in range(request_id * 20_000))  # some real CPU work


class Tally:
    def __init__(self) -> None:
        self.counts = {"done": 0, "crashed": 0, "lost": 0}
        self._lock = threading.Lock()

    def add(self, what: str) -> None:
        with self._lock:
            self.counts[what] += 1


def worker(queue: leaseq.Queue, crash_once: threading.Event, tally: Tally) -> None:
    with psycopg.connect(queue.dsn) as conn:
        idle_since = time.monotonic()
        while time.monotonic() - idle_since < LEASE * 2:
            claims = queue.claim("reports", limit=1, lease=LEASE)
            if not claims:
                time.sleep(0.05)
                continue
            idle_since = time.monotonic()
            claim = claims[0]
            if not crash_once.is_set():
                crash_once.set()  # this worker "dies" holding the claim
                tally.add("crashed")
                continue
            total = generate(claim.payload["request_id"])
            try:
                with conn.transaction():
                    conn.execute(
                        f"INSERT INTO {SCHEMA}.report VALUES (%s, %s, %s)"
                        " ON CONFLICT (idempotency_key) DO NOTHING",
                        (claim.idempotency_key, claim.payload["request_id"], total),
                    )
                    queue.complete(claim, conn=conn)
                tally.add("done")
            except leaseq.LeaseLost:
                tally.add("lost")


def main() -> None:
    with leaseq.Queue(schema=SCHEMA) as queue:
        print(f"database: {queue.dsn}")
        setup(queue)
        started = time.monotonic()
        for n in range(REPORTS):
            submit(queue, f"customer-{n % 5}")
        print(f"accepted {REPORTS} report requests in {time.monotonic() - started:.2f}s")
        tally = Tally()
        crash_once = threading.Event()
        threads = [
            threading.Thread(target=worker, args=(queue, crash_once, tally)) for _ in range(WORKERS)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        with psycopg.connect(queue.dsn) as conn:
            reports = conn.execute(f"SELECT count(*) FROM {SCHEMA}.report").fetchone()
        (stats,) = queue.stats("reports")
        done, crashed = tally.counts["done"], tally.counts["crashed"]
        print(f"workers completed {done} jobs; {crashed} crashed mid-job and was recovered")
        print(f"reports written: {reports[0] if reports else 0} (one per request, no duplicates)")
        print("jobs by status: " + ", ".join(f"{k}={v}" for k, v in stats.counts.items()))
        ok = reports is not None and reports[0] == REPORTS and stats.counts["done"] == REPORTS
        print("OK" if ok else "MISMATCH")
        raise SystemExit(0 if ok else 1)


if __name__ == "__main__":
    main()
