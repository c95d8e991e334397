"""The oracle of the rate-limit tests: how many starts one window holds at most."""

from __future__ import annotations


def most_in_any_window(starts: list[float], seconds: float) -> int:
    """The most of ``starts`` within any half-open window of ``seconds``."""
    ordered = sorted(starts)
    most, low = 0, 0
    for high, at in enumerate(ordered):
        while at - ordered[low] >= seconds:
            low += 1
        most = max(most, high - low + 1)
    return most
