"""Which queues may have a job to claim: the claim loop asks only those.

A claim that comes back with fewer jobs than it asked for says that its queue
had nothing more to claim: asking again because a slot freed up would only send
an empty claim. (At 200 jobs/s a worker sent two empty claims per job, one when
the handler returned and one when its acknowledgement did, and a notification
arriving meanwhile waited for them: the start latency's p95 was twice the
median.) A queue is asked again once something may have put work there:

* a notification names it, or the listener reconnected (what was sent while it
  was away is unknown);
* an attempt of it ended in a way that can make a job claimable: a keyed job
  (its successor), a retry, a release;
* the poll comes due: a delayed job whose time has come, an expired lease, an
  enqueue without NOTIFY are announced by no one;
* a rate limit held its claim back, and its window has room again (the claim
  says when). A concurrency limit's freed slot is announced by a notification
  (the job_slot_freed trigger);
* the worker has just entered the queue as waited on, and a producer that
  missed the entry may commit a job without notifying (.wake_entries says when
  to ask again).

Each queue has a generation, bumped by every such hint: a claim that comes back
short clears its queue only if no hint arrived while it was in flight (a job
committed after the claim's snapshot is announced by a notification the claim
could not see).
"""

from __future__ import annotations

import random
import time
from collections.abc import Iterable, Sequence


class WorkHints:
    def __init__(self, queues: Sequence[str], poll_interval: float) -> None:
        self._queues = tuple(queues)
        self._poll_interval = poll_interval
        self._generation = dict.fromkeys(self._queues, 0)
        self._maybe = set(self._queues)
        self._next_poll = self._jittered_poll()
        self._due: dict[str, float] = {}  # queue -> when a rate window has room again

    def may_have_work(self, queue: str | None = None) -> None:
        """A hint that ``queue`` (None: every queue) may have something to claim."""
        for name in self._queues if queue is None else (queue,):
            if name in self._generation:
                self._generation[name] += 1
                self._maybe.add(name)

    def to_ask(self, order: Iterable[str]) -> list[tuple[str, int]]:
        """The queues worth a claim now, in ``order``, each with its generation."""
        now = time.monotonic()
        if now >= self._next_poll:
            self.may_have_work()
            self._next_poll = self._jittered_poll()
        for name, due in list(self._due.items()):
            if now >= due:
                del self._due[name]
                self.may_have_work(name)
        return [(name, self._generation[name]) for name in order if name in self._maybe]

    def came_back_short(self, queue: str, generation: int) -> None:
        """A claim asked at ``generation`` found less than it could take."""
        if self._generation[queue] == generation:
            self._maybe.discard(queue)

    def ask_again_in(self, queue: str, seconds: float) -> None:
        """Ask ``queue`` again in ``seconds`` (a rate limit held its claim back, or its
        wake-up entry is settling)."""
        due = time.monotonic() + seconds
        self._due[queue] = min(self._due.get(queue, due), due)

    def awaiting_room(self) -> bool:
        """A rate limit held a claim back and its window has no room yet."""
        return bool(self._due)

    def until_poll(self) -> float:
        """Seconds until the poll, or a rate window's room, whichever is first."""
        return max(min([self._next_poll, *self._due.values()]) - time.monotonic(), 0.0)

    def _jittered_poll(self) -> float:
        # Below the interval, never past it: the interval is what a job nobody
        # announces may wait for an idle worker. Spread over its last quarter,
        # the workers of a deploy drift out of step within a few polls.
        return time.monotonic() + self._poll_interval * random.uniform(0.75, 1.0)
