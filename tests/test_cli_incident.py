"""The operator's commands in an incident: what they print of text someone else
wrote (a job's error, an actor's name) cannot drive the operator's terminal, and
a bulk replay does what it says while workers run beside it."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

import leaseq
from leaseq import JobStatus
from leaseq._store.operators import OperatorOperations

from .conftest import ROOT, Clock
from .test_cli import Invoke, invoke

__all__ = ["invoke"]  # the fixture, used by name

#: Every C0 control but newline, DEL, and the C1 controls (CSI, OSC...): what a
#: terminal acts on rather than shows. A newline only starts a table's next line.
TERMINAL_CONTROL = re.compile(r"[\x00-\x09\x0b-\x1f\x7f-\x9f]")

#: An error text as a handler may raise it from what a remote service answered:
#: colour, a window title (OSC), a cleared screen, a carriage return over the line.
HOSTILE = "boom\x1b[31mRED\x1b]0;pwned\x07\x1b[2J\r\x9b1Aover\x08"


def test_failed_never_writes_a_jobs_error_text_to_the_terminal_raw(
    invoke: Invoke, queue: leaseq.Queue
) -> None:
    """`leaseq failed` printed a job's stored error as it was: an error text
    quoting an attacker's answer (escape sequences) recoloured, retitled or
    cleared the operator's terminal. The text is still shown, its controls visible."""
    queue.enqueue_many("reports", [{}], max_attempts=1)
    (claim,) = queue.claim("reports")
    queue.fail(claim, HOSTILE)
    output = invoke("failed").output
    assert not TERMINAL_CONTROL.search(output), repr(output)
    assert all(part in output for part in ("boom", "RED", "pwned")), output


def test_audit_never_writes_an_actors_name_to_the_terminal_raw(
    invoke: Invoke, queue: leaseq.Queue
) -> None:
    """An actor is any text a caller of the library names (a dashboard's user):
    `leaseq audit` printed it raw."""
    queue.enqueue_many("reports", [{}], max_attempts=1)
    (claim,) = queue.claim("reports")
    queue.fail(claim, "boom")
    assert queue.replay(claim.job_id, actor="mallory\x1b]0;pwned\x07\x1b[2J")
    output = invoke("audit").output
    assert not TERMINAL_CONTROL.search(output), repr(output)
    assert "mallory" in output


# -- replay --all-failed beside workers and other operators -----------------------------


def _fail_all(queue: leaseq.Queue, name: str, count: int) -> list[int]:
    ids = queue.enqueue_many(name, [{"n": n} for n in range(count)], max_attempts=1)
    claims = queue.claim(name, limit=count)
    queue.fail_many(claims, ["boom"] * len(claims))
    return list(ids)


def test_replay_all_failed_leaves_a_job_skipped_meanwhile_skipped(
    invoke: Invoke, queue: leaseq.Queue, connect: Any
) -> None:
    """Another operator skips a failed job (`leaseq cancel`) while `replay --queue Q
    --all-failed` runs: the replay found the job failed, waited for the skip's
    lock, and then replayed the job just skipped (its status re-check on the
    locked row let a cancelled job through): work an operator decided must not
    run ran."""
    skipped, other = _fail_all(queue, "reports", 2)
    skipper = connect()  # the skip: done, not committed yet
    skipper.execute("SELECT 1")  # (its transaction open: the skip runs inside it)
    assert queue._db.run(queue._store.cancel(skipped, only_failed=True, actor="alice"), skipper)
    with ThreadPoolExecutor(1) as pool:
        replaying = pool.submit(invoke, "replay", "--queue", "reports", "--all-failed")
        watcher = connect(autocommit=True)
        while not watcher.execute(
            "SELECT 1 FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
            " AND query LIKE %s AND query LIKE 'WITH shown AS%%'",  # (replay.sql; cut at 1 kB)
            [f"%{queue.schema}%"],
        ).fetchone():
            assert not replaying.done(), replaying.result().output
            time.sleep(0.01)
        skipper.commit()
        output = replaying.result(timeout=60).output
    assert queue.get(skipped).status is JobStatus.CANCELLED
    assert queue.get(other).status is JobStatus.QUEUED
    assert "replayed 1 jobs" in output


def test_replay_all_failed_replays_each_failed_job_once_while_workers_fail_them_again(
    invoke: Invoke, queue: leaseq.Queue, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`replay --queue Q --all-failed` took batch after batch of the queue's failed
    jobs until one came back short: a worker that failed the replayed jobs again
    (the bug not fixed yet) put them back in the next batch, so the command
    replayed the same jobs again and again, as long as workers kept up (here three
    rounds, then the worker stops), and counted every round. The jobs failed when
    it began are replayed once each; those that fail again stay failed."""
    failed = _fail_all(queue, "reports", 1001)  # one batch of 1,000, then one more
    replay_batch = OperatorOperations.replay_failed
    rounds = []

    def worker_between_batches(store: Any, *args: Any, **kwargs: Any) -> Any:
        if rounds and len(rounds) <= 3:  # the replayed jobs run, and fail again
            claims = queue.claim("reports", limit=1000)
            queue.fail_many(claims, ["boom again"] * len(claims))
        rounds.append(1)
        return replay_batch(store, *args, **kwargs)

    monkeypatch.setattr(OperatorOperations, "replay_failed", worker_between_batches)
    output = invoke("replay", "--queue", "reports", "--all-failed").output
    monkeypatch.undo()
    assert "replayed 1001 jobs" in output
    replayed = [i for e in queue.audit_log(queue="reports") for i in e.job_ids]
    assert sorted(replayed) == failed  # each once


# -- prune: an operator's removal of jobs is audited ----------------------------------


def test_prune_says_in_the_audit_log_who_removed_which_jobs(
    invoke: Invoke, queue: leaseq.Queue, clock: Clock
) -> None:
    """`leaseq prune --older-than 1s --state failed` deletes the failed jobs kept for
    investigation, and nothing said who did (every other command that changes
    jobs writes the audit log). A dry run changes nothing and writes nothing."""
    failed = _fail_all(queue, "reports", 3)
    queue.configure_queue("archived", retention_mode="archive")
    archived = _fail_all(queue, "archived", 2)
    clock.advance(10)
    invoke("prune", "--older-than", "1s", "--state", "failed", "--dry-run")
    assert [e.action for e in queue.audit_log()] == ["configure"]
    assert "removed 5 finished jobs" in invoke("prune", "--older-than", "1s").output
    entries = {e.queue: e for e in queue.audit_log() if e.action == "prune"}
    assert sorted(entries) == ["archived", "reports"]
    assert sorted(entries["reports"].job_ids) == failed
    assert sorted(entries["archived"].job_ids) == archived
    assert all(e.actor.startswith("cli:") for e in entries.values())
    shown = invoke("audit", "--json").output
    assert '"action": "prune"' in shown


# -- failed: a listing cut at its limit says so -----------------------------------------


def test_failed_says_when_it_shows_only_some_of_the_failed_jobs(
    invoke: Invoke, queue: leaseq.Queue
) -> None:
    """`leaseq failed` lists the newest 50 failed jobs: with 3,000 failed it showed
    50 rows and nothing else, which reads as "50 jobs failed"."""
    _fail_all(queue, "reports", 3)
    cut = invoke("failed", "--limit", "2").output
    assert re.search(r"\b2\b.*\bof\b.*\b3\b", cut), cut
    assert "--limit" in cut
    whole = invoke("failed", "--limit", "3").output
    assert "--limit" not in whole


def test_audit_says_how_many_jobs_a_bulk_action_took(invoke: Invoke, queue: leaseq.Queue) -> None:
    """A bulk replay's row listed its first ten job ids and "...": how many jobs the
    action took (12 or 12,000) was not said."""
    _fail_all(queue, "reports", 12)
    invoke("replay", "--queue", "reports", "--all-failed")
    output = invoke("audit").output
    assert re.search(r"\b12 jobs\b", output), output


def test_replay_all_failed_says_which_failed_jobs_it_left(
    invoke: Invoke, queue: leaseq.Queue
) -> None:
    """A failed unique job whose key another job of its queue holds now is left
    failed by `replay --all-failed` (a replay never makes a second unfinished job
    of a key): it printed "replayed 0 jobs", exit 0, and the job was still
    failed, with nothing said why (`replay JOB_ID` says so: UniqueKeyHeld)."""
    _fail_all(queue, "reports", 1)
    held = queue.enqueue("reports", {}, unique_key="invoice:7", max_attempts=1)
    queue.fail(queue.claim("reports")[0], "boom")
    queue.enqueue("reports", {}, unique_key="invoice:7")  # holds the key now
    output = invoke("replay", "--queue", "reports", "--all-failed").output
    assert "replayed 1 jobs" in output
    assert "1 failed job" in output, output
    assert "unique key" in output, output
    assert queue.get(held).status is JobStatus.FAILED


def test_replay_or_cancel_of_an_archived_job_says_where_it_went(
    invoke: Invoke, queue: leaseq.Queue, clock: Clock
) -> None:
    """A failed job that retention moved to the archive: `leaseq replay ID` said
    "no job ID", as of an id mistyped, while the job sits in the archive."""
    queue.configure_queue("reports", retention_mode="archive")
    (job_id,) = _fail_all(queue, "reports", 1)
    clock.advance(10)
    invoke("prune", "--older-than", "1s")
    for command in ("replay", "cancel"):
        result = invoke(command, str(job_id), ok=False)
        assert result.exit_code == 1
        assert "archive" in result.output, result.output
    mistyped = invoke("replay", "424242", ok=False)
    assert "no job 424242" in mistyped.output
    assert "archive" not in mistyped.output


# -- the worker's log at a terminal -----------------------------------------------------

HOSTILE_APP = """
import leaseq

app = leaseq.App()


@app.on_failure
def report(job, error, will_retry):
    raise RuntimeError("the error tracker refused it") from error


@app.task("logs", max_attempts=1)
def broken(job):
    raise RuntimeError("upstream said: boom\\x1b[31mRED\\x1b]0;pwned\\x07\\x1b[2J")
"""


def test_the_workers_rich_log_never_writes_an_errors_controls_raw(
    queue: leaseq.Queue, database_url: str, tmp_path: Path
) -> None:
    """`leaseq worker` (rich log format, for a person at a terminal) logged a
    failing hook's traceback as it was: the handler's error it chains, quoting a
    remote answer, drove the terminal of whoever watched the worker."""
    (tmp_path / "hostile_app.py").write_text(HOSTILE_APP)
    (job_id,) = queue.enqueue_many("logs", [{}])
    environment = {k: v for k, v in os.environ.items() if not k.endswith("DATABASE_URL")}
    environment["PYTHONPATH"] = str(ROOT / "src")
    process = subprocess.run(
        [sys.executable, "-m", "leaseq", "worker", "hostile_app:app", "--burst",
         "--no-maintenance", "--log-format", "rich", "--database-url", database_url,
         "--schema", queue.schema],
        cwd=tmp_path, env=environment, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert process.returncode == 0, process.stderr
    assert queue.get(job_id).status is JobStatus.FAILED
    assert "pwned" in process.stderr, process.stderr  # the traceback was logged
    assert not TERMINAL_CONTROL.search(process.stderr), repr(process.stderr)
