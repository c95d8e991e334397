"""Settings in seconds as the text people read and type back (CLI and dashboard).

Exact: ``%g`` keeps six significant digits and writes ``1e+06``, so a stored
1,000,001 s read as ``1e+06s`` (another value, in a form the CLI refuses as
input) and 1234.5678 s as ``1234.57s``.
"""

from __future__ import annotations

from decimal import Decimal

#: The units a duration is shown in, largest first (a whole number of one).
_UNITS = (("d", 86400), ("h", 3600), ("m", 60))


def exact_number(value: float) -> str:
    """``value`` in decimal digits, all of them and no exponent: the shortest text
    that reads back as the same float."""
    text = format(Decimal(repr(float(value))), "f")
    return text.removesuffix(".0")


def duration_text(seconds: float | None, never: str = "never") -> str:
    """``1d``, ``2h``, ``90s``, ``1000001s``, ``1234.5678s``; ``never`` for None
    (a retention kept forever)."""
    if seconds is None:
        return never
    for unit, length in _UNITS:
        if seconds >= length and seconds % length == 0:
            return f"{exact_number(seconds / length)}{unit}"
    return f"{exact_number(seconds)}s"
