"""How a worker process counts SIGTERM/SIGINT: the first stops it gracefully, the next at once.

A child of ``leaseq worker --processes N`` often gets one stop signal twice: a
terminal's Ctrl-C and systemd's ``KillMode=control-group`` signal the whole
process group (or cgroup), and the supervisor forwards its own copy too (it must:
``kill <supervisor>`` reaches only the supervisor). Read as two signals, that
would skip the graceful stop. So in supervised children a repeat within
:data:`ECHO_WINDOW` seconds of the first is taken as that signal's echo. A
deliberate second signal comes later (a second Ctrl-C), and the supervisor
escalates its own second signal to SIGKILL anyway.
"""

from __future__ import annotations

import time
from typing import ClassVar

#: Long enough for the supervisor's forwarded copy to arrive after the group's, even
#: on a loaded machine; short next to how soon anyone presses Ctrl-C a second time.
ECHO_WINDOW = 1.0


def treat_repeats_as_echoes(window: float = ECHO_WINDOW) -> None:
    """Called once by a supervised child, before its worker starts."""
    StopSignals.echo_window = window


class StopSignals:
    """Counts the stop signals a worker receives, echoes left out."""

    #: 0 outside supervised children: there, every signal counts.
    echo_window: ClassVar[float] = 0.0

    def __init__(self) -> None:
        self.count = 0
        self._first_at: float | None = None

    def received(self) -> int:
        """1 for the first signal, 2 and more for deliberate repeats, 0 for an echo."""
        now = time.monotonic()
        if self._first_at is None:
            self._first_at = now
        elif now - self._first_at < self.echo_window:
            return 0
        self.count += 1
        return self.count
