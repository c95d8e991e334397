"""A job's payload values masked in a text about it (contract 7: stored error text
never holds the payload): an error a handler raised on its input often quotes
that input, secret fields and all (pydantic's ``input_value={...}``).

:func:`without_payload` masks each value worth hiding in every form a message
quotes it in (as written, repr, JSON, quoted twice, URL-encoded), in one pass
over at most :data:`SCANNED_CHARS` of the text, linear in the payload. It runs
on failures only, never on a job that succeeds.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator
from urllib.parse import quote, quote_plus

from ._redact import MIN_SECRET_CHARS, PLACEHOLDER, remembered

#: A payload's numbers are masked from four characters of text on (``2024``, ``4111…``,
#: ``19.75``, ``-123``): a PIN, an amount, an account or card number. Shorter ones
#: (counts, a quantity, an HTTP status, ``1.5``) are in almost every message, hide
#: nothing among at most a thousand guesses, and masking them would leave the message
#: unreadable. Strings are masked from MIN_SECRET_CHARS (three) on, as remembered
#: secrets are: a three-letter value (a currency, a state) may take a word of the
#: message with it now and then, a price paid for hiding short codes and names.
MIN_NUMBER_CHARS = 4

#: How much of a text is searched for payload values: four times a stored error's
#: 2,000 characters, room for the values masked before the rest. A longer text is
#: cut (see :func:`_cut`) and ends with "…": searched whole, an error quoting a
#: payload at the size cap (a megabyte) would cost seconds of the worker's loop.
SCANNED_CHARS = 8000

#: What stands for a text whose payload values could not be looked for (a payload
#: no JSON holds, from a hand-made claim): withheld rather than risked.
WITHHELD = "(text withheld: it could not be checked for the job's payload values)"

#: Needles are looked up by their first (up to) this many characters: one lookup
#: per position of the text and length of key, however many needles there are.
_KEY_CHARS = 16
#: Characters no quoting changes (repr, JSON, URL-encoding): a run of them in a
#: value is in every form of it.
_PLAIN = re.compile(r"[A-Za-z0-9_.~-]+")
#: A value with one of these has other forms in a repr or a JSON string.
_ESCAPED = re.compile(r"""['"\\]|[^ -~]""")
#: Where a text may be cut.
_SPACES = " \t\r\n"


class PayloadFree(str):
    """A text leaseq composed itself (a timeout, no attempts left): it quotes no
    payload, so a word of it that happens to equal a payload value (a ``timed``
    backend, in ``timed out``) is not masked as one."""


def without_payload(text: str, payload: object) -> str:
    """``text`` with each of ``payload``'s values worth hiding replaced by ``***``;
    never raises."""
    if isinstance(text, PayloadFree):
        return text
    try:
        return PayloadValues(payload).mask(text)
    except Exception:
        return WITHHELD


class PayloadValues:
    """The values of one payload worth hiding (not its keys, booleans nor nulls:
    those are no one's secret, and name what went wrong), to mask in texts about
    its job: as written, as a repr or a JSON string quotes them (once, or twice:
    the repr of an exception whose message holds a dict's repr), URL-encoded."""

    def __init__(self, payload: object) -> None:
        self._values = frozenset(_values(payload))

    def mask(self, text: str) -> str:
        """``text`` with every occurrence of a value replaced by ``***``. The union
        of the occurrences is masked: a value holding another is masked whole."""
        values = [value for value in self._values if len(value) <= len(text)]
        if not values:
            return text
        end = _cut(text)
        scanned = text[:end]
        spans = _Needles(_forms_in(scanned, values)).longest(scanned)
        if end == len(text):
            return _masked(scanned, spans)
        spans += _across(text, end, values)
        return _masked(scanned, spans) + "…"


#: More strings and numbers than a payload at the size cap can hold: a payload
#: past it (a handler's own objects added to ``job.payload``) is not walked on.
_MAX_NODES = 2_000_000


def _values(payload: object) -> Iterator[str]:
    """The text of each string and number of ``payload`` worth hiding.

    Each container once: a stored payload is JSON (a tree), but ``job.payload``
    is the handler's to change, and one that made a loop in it (a child linked
    to its parent) had this walk run for ever on the worker's loop."""
    pending = [payload]
    seen: set[int] = set()
    walked = 0
    while pending:  # a loop, not recursion: a payload nests up to 256 levels
        value = pending.pop()
        walked += 1
        if walked > _MAX_NODES:
            raise ValueError("a payload too large to look through")  # WITHHELD
        if isinstance(value, dict | list | tuple):
            if id(value) in seen:
                continue
            seen.add(id(value))
        if isinstance(value, dict):
            pending.extend(value.values())
        elif isinstance(value, list | tuple):
            pending.extend(value)
        elif isinstance(value, str):
            if len(value) >= MIN_SECRET_CHARS:
                yield value
        elif isinstance(value, int | float) and not isinstance(value, bool):
            text = repr(value)  # as str() and JSON write it
            if len(text) >= MIN_NUMBER_CHARS:
                yield text


def _forms_in(text: str, values: list[str]) -> set[str]:
    """The forms of ``values`` that may be in ``text``. Most values have one (no
    quoting changes them); another has up to 27 (see :func:`_forms`), computed only
    when the longest run of it no quoting changes, which each form holds, is in the
    text: the cost of a failure stays that of its message, not of its payload."""
    forms: set[str] = set()
    by_core: dict[str, list[str]] = {}
    for value in values:
        if _PLAIN.fullmatch(value):
            forms.add(value)
        elif (core := _core(value)) is None:
            forms.update(_forms(value))
        else:
            by_core.setdefault(core, []).append(value)
    for core in _Needles(by_core).found(text):
        for value in by_core[core]:
            forms.update(_forms(value))
    return {form for form in forms if len(form) <= len(text)}


def _core(value: str) -> str | None:
    """The longest run of ``value`` that every form of it holds (None: too short to
    tell anything)."""
    core = max(_PLAIN.findall(value), key=len, default="")
    return core if len(core) >= MIN_SECRET_CHARS else None


def _forms(value: str) -> set[str]:
    """``value`` as written, as a repr or a JSON string quotes it, either of those
    quoted once more, and URL-encoded."""
    if _PLAIN.fullmatch(value):
        return {value}  # most values: no quoting changes them
    forms = {value, quote(value, safe=""), quote_plus(value, safe="")}
    if _ESCAPED.search(value):
        for form in _quoted(value):
            forms.update(_quoted(form))
    return forms


def _quoted(value: str) -> set[str]:
    """``value`` and its forms inside a repr (either quote) and a JSON string."""
    return {
        value,
        repr(value)[1:-1],
        repr(value + '"')[1:-2],  # single-quoted even when it holds a "'"
        json.dumps(value)[1:-1],
        json.dumps(value, ensure_ascii=False)[1:-1],
    }


def _cut(text: str) -> int:
    """Where the search ends: the whole text, or a whitespace at most SCANNED_CHARS
    in. Not inside a word where one can: a URL's password, a token or a
    ``key=value`` that ran on past the cut would lose what marks it as one (its
    '@', its end). A text with no whitespace in the second half of the window (a
    long URL, compact JSON, a blob) is cut at SCANNED_CHARS itself: cut at its
    last whitespace, it lost all or most of its message ("ValueError: …")."""
    if len(text) <= SCANNED_CHARS:
        return len(text)
    window = text[:SCANNED_CHARS]
    at = max(window.rfind(space) for space in _SPACES)
    return at if at >= SCANNED_CHARS // 2 else SCANNED_CHARS


def _across(text: str, end: int, values: list[str]) -> list[tuple[int, int]]:
    """The part before ``end`` of each value or remembered secret the cut at ``end``
    (a whitespace) runs through, masked too rather than shown in part. Only one
    with a whitespace can; each is looked for near the cut only: linear in all."""
    needles = {secret for secret in remembered() if len(secret) > 1}
    in_a_word = text[end] not in _SPACES  # (a text cut where it had no whitespace)
    for value in values:
        if in_a_word or any(space in value for space in _SPACES):
            core, reach = _core(value), 16 * len(value)  # no form is 16 times longer
            if core is None or text.find(core, max(end - reach, 0), end + reach) >= 0:
                needles.update(_forms(value))
    spans = []
    for needle in needles:
        start = text.find(needle, max(end - len(needle) + 1, 0), end + len(needle) - 1)
        if 0 <= start < end:
            spans.append((start, end))
    return spans


class _Needles:
    """Strings to find in a text, by their first characters and their length: one
    pass over the text (a lookup per position and length of key, then per length
    of the needles that start so) finds them all, however many."""

    def __init__(self, needles: Iterable[str]) -> None:
        tables: dict[int, dict[str, dict[int, set[str]]]] = {}
        for needle in needles:
            key = needle[:_KEY_CHARS]
            by_key = tables.setdefault(len(key), {})
            by_key.setdefault(key, {}).setdefault(len(needle), set()).add(needle)
        # Longest keys first, and per key its longest needles first.
        self._tables = [
            (length, {key: sorted(sizes.items(), reverse=True) for key, sizes in by_key.items()})
            for length, by_key in sorted(tables.items(), reverse=True)
        ]

    def _at(self, text: str, start: int) -> Iterator[str]:
        """The needles at ``start``, longest first."""
        for length, by_key in self._tables:
            for size, needles in by_key.get(text[start : start + length], ()):
                candidate = text[start : start + size]
                if candidate in needles:
                    yield candidate

    def longest(self, text: str) -> list[tuple[int, int]]:
        """Where the longest needle at each position of ``text`` is."""
        spans = []
        for start in range(len(text) if self._tables else 0):
            needle = next(self._at(text, start), None)
            if needle is not None:
                spans.append((start, start + len(needle)))
        return spans

    def found(self, text: str) -> set[str]:
        """Every needle in ``text``."""
        return {
            n for start in range(len(text) if self._tables else 0) for n in self._at(text, start)
        }


def _masked(text: str, spans: list[tuple[int, int]]) -> str:
    """``text`` with each run of overlapping or adjacent spans replaced by ``***``."""
    pieces: list[str] = []
    position = 0
    for start, end in sorted(spans):
        if start > position or not pieces:
            pieces += [text[position:start], PLACEHOLDER]
        position = max(position, end)
    pieces.append(text[position:])
    return "".join(pieces)
