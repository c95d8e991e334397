"""The operator's commands in an incident: what they print of text someone else
wrote (a job's error, an actor's name) cannot drive the operator's terminal, and
a bulk replay does what it says while workers run beside it."""

from __future__ import annotations

import re

import leaseq

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
