"""What PostgreSQL redoes in every statement that writes a job.

PostgreSQL stores a table's CHECK constraints and its triggers' WHEN clauses as
serialized expression trees. It reads them back from that text and plans them
again in every INSERT or UPDATE statement, once per statement and whatever the
number of rows. A one-job enqueue, a one-job claim or a one-job completion
pays for all of it. Before migration 0010 that was 7.7 kB of CHECK text and
9 kB of WHEN text on each claim and completion: about 140 µs of server time
per statement on the benchmark machine (bench/README.md). Adding a CHECK or a
long WHEN clause costs every statement. This budget makes that a choice.
"""

from __future__ import annotations

import psycopg
import pytest
from psycopg.errors import CheckViolation

import leaseq

# The serialized text PostgreSQL re-reads for one UPDATE OF status of a job:
# every CHECK of the table plus the WHEN clause of every row trigger on
# status. 3.6 kB after 0010 (on PostgreSQL 15); 16.7 kB before.
PER_STATEMENT_BUDGET = 4_500


def _reread_per_status_update(queue: leaseq.Queue) -> dict[str, int]:
    table = f'"{queue.schema}".job'
    with queue.connection() as conn:
        rows = conn.execute(
            """
            SELECT 'check ' || conname, length(conbin::text)
            FROM pg_constraint
            WHERE conrelid = %(table)s::regclass AND contype = 'c'
            UNION ALL
            SELECT 'trigger ' || t.tgname, length(t.tgqual::text)
            FROM pg_trigger AS t
            JOIN pg_attribute AS a ON a.attrelid = t.tgrelid AND a.attname = 'status'
            WHERE t.tgrelid = %(table)s::regclass AND t.tgqual IS NOT NULL
              AND t.tgtype & 16 <> 0  -- fires on UPDATE
              AND t.tgtype & 1 <> 0  -- per row
              AND (t.tgattr = '' OR a.attnum = ANY (t.tgattr))
            """,
            {"table": table},
        ).fetchall()
    return dict(rows)


def test_a_status_update_rereads_little_expression_text(queue: leaseq.Queue) -> None:
    reread = _reread_per_status_update(queue)
    # The state machine's own invariants are still the table's.
    assert sum(name.startswith("check ") for name in reread) >= 4
    assert {
        "trigger job_backlog_count",
        "trigger job_key_leave_update",
        "trigger job_unique_follow_status",
        "trigger job_slot_freed",
    } <= set(reread)
    assert sum(reread.values()) < PER_STATEMENT_BUDGET, sorted(
        reread.items(), key=lambda item: -item[1]
    )


def test_the_state_invariants_hold_against_raw_sql(queue: leaseq.Queue, database_url: str) -> None:
    """The checks that stayed refuse a row the state machine never makes."""
    job_id = queue.enqueue("reports", {"report_id": 1})
    table = f'"{queue.schema}".job'
    broken = [
        f"UPDATE {table} SET status = 'running' WHERE job_id = %s",  # no lease
        f"UPDATE {table} SET status = 'lost' WHERE job_id = %s",
        f"UPDATE {table} SET ordering_key = 'k' WHERE job_id = %s",  # no seq
        f"UPDATE {table} SET unique_held = true WHERE job_id = %s",  # no unique key
    ]
    for statement in broken:
        with psycopg.connect(database_url) as conn, pytest.raises(CheckViolation):
            conn.execute(statement, (job_id,))
    (claim,) = queue.claim("reports")
    assert claim.job_id == job_id
