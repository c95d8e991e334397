"""What the user typed, read into library arguments: the Jobs page's filter and
the queue settings form. Bad input raises ``leaseq.InvalidArgument`` with a
message the page shows; nothing is sent to the database then."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any
from urllib.parse import urlencode

import leaseq

from .._secret_fields import SecretMask
from .views import group_digest, retention

STATES = tuple(state.value for state in leaseq.JobStatus)
#: ``failed_groups()`` groups failed jobs by the first this many characters of
#: their last error (its SQL; an empty one with those without one, as
#: ``failed_group`` matches them): a group's replay selects exactly those.
FAILED_GROUP_CHARS = 300


#: ``int()`` refuses more than 4300 digits; no number typed here needs a fraction of that.
MAX_DIGITS = 4000


def digits(text: str) -> bool:
    """Whether ``int(text)`` reads ``text`` as written: ASCII digits only (``str.isdigit``
    also accepts ``²``, which ``int()`` refuses, and other scripts' digits, which it
    reads), and not so many that ``int()`` refuses them."""
    return 0 < len(text) <= MAX_DIGITS and text.isascii() and text.isdigit()


@dataclass(frozen=True, slots=True)
class JobFilter:
    """The Jobs page's filter, as it travels in query strings and hidden fields."""

    queue: str = ""
    state: str = ""
    key: str = ""
    error: str = ""
    payload: str = ""  # ``customer:acme region:"eu west"``
    before: int | None = None
    #: The window's top of the search's first page (``JobPage.window_top``), with
    #: ``before``: its later pages search that same window, however many jobs come.
    top: int | None = None
    #: A Failed page group's ``group_digest``: its jobs only (exactly its error text;
    #: ``error`` is a substring, and a case-insensitive one).
    digest: str = ""

    @classmethod
    def read(cls, values: Mapping[str, str]) -> JobFilter:
        state = values.get("state", "").strip()
        if state and state not in STATES:
            raise leaseq.InvalidArgument(f"state must be one of {', '.join(STATES)}")
        before = values.get("before", "").strip()
        if before and not digits(before):
            raise leaseq.InvalidArgument("before must be a job id")
        top = values.get("top", "").strip() if before else ""
        if top and not digits(top):
            raise leaseq.InvalidArgument("top must be a job id")
        digest = values.get("digest", "").strip()
        if digest and not re.fullmatch(r"[0-9a-f]{64}", digest):
            raise leaseq.InvalidArgument("digest must be a failed group's 64 hexadecimal digits")
        return cls(
            # (a queue name holds no spaces: stripping one typed with some is safe)
            queue=values.get("queue", "").strip(),
            state=state,
            # Not stripped: an ordering key matches exactly, and may start or end
            # with spaces (its own links carry them).
            key=values.get("key", ""),
            error=values.get("error", "").strip(),
            payload=values.get("payload", "").strip(),
            before=int(before) if before else None,
            top=int(top) if top else None,
            digest=digest,
        )

    def arguments(self, mask: SecretMask) -> dict[str, Any]:
        """``find_jobs`` keyword arguments (without limit and window)."""
        return {
            "queue": self.queue or None,
            "status": self.state or None,
            "key": self.key or None,
            "error": self.error or None,
            "payload": payload_filter(self.payload, mask),
            "before": self.before,
            "window_top": self.top,
        }

    def query(self, **changes: Any) -> str:
        """This filter (with ``changes``) as a query string, empty fields left out."""
        values = replace(self, **changes)
        fields = {
            "queue": values.queue,
            "state": values.state,
            "key": values.key,
            "error": values.error,
            "payload": values.payload,
            "before": "" if values.before is None else str(values.before),
            "top": "" if values.top is None or values.before is None else str(values.top),
            "digest": values.digest,
        }
        return urlencode({name: value for name, value in fields.items() if value})

    @property
    def empty(self) -> bool:
        return not (
            self.queue or self.state or self.key or self.error or self.payload or self.digest
        )


def payload_filter(text: str, mask: SecretMask) -> dict[str, Any] | None:
    """``customer:acme n:5 address.city:Paris`` as a containment document:
    ``{"customer": "acme", "n": 5, "address": {"city": "Paris"}}``. Unquoted values
    written as JSON writes numbers, booleans and null are those; a quoted value is
    always a string (``zip:"01234"``, ``flag:"true"``), and so is ``01234`` (JSON
    writes no leading zeros). Quote a value with spaces. Secret fields cannot be
    searched (a search would reveal their values)."""
    if not text:
        return None
    document: dict[str, Any] = {}
    for word in _words(text):
        field, colon, raw = word.text.partition(":")
        if not colon or not field:
            raise leaseq.InvalidArgument(
                f"payload filter: {word.text!r} is not field:value (e.g. customer:acme)"
            )
        path = field.split(".")
        if any(not part or mask.secret(part) for part in path):
            raise leaseq.InvalidArgument(f"payload filter: {field!r} cannot be searched")
        target = document
        for part in path[:-1]:
            nested = target.setdefault(part, {})
            if not isinstance(nested, dict):
                raise leaseq.InvalidArgument(f"payload filter: {field!r} given twice")
            target = nested
        if path[-1] in target:  # (else the later would silently replace the earlier)
            raise leaseq.InvalidArgument(f"payload filter: {field!r} given twice")
        target[path[-1]] = raw if word.quoted_after(len(field)) else _literal(field, raw)
    return document


#: A number, boolean or null as JSON writes it (no leading zeros, no exponent).
_JSON_LITERAL = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?|true|false|null")


def _literal(field: str, raw: str) -> Any:
    """An unquoted value: the JSON number, boolean or null it spells, else the text."""
    if not _JSON_LITERAL.fullmatch(raw):
        return raw
    try:
        return json.loads(raw)
    except ValueError:  # more digits than int() reads
        raise leaseq.InvalidArgument(f"payload filter: {field!r}: the number is too long") from None


@dataclass(frozen=True, slots=True)
class _Word:
    """A word of a payload filter, its quotes and escapes removed."""

    text: str
    #: (start, end) in ``text`` of each part that was quoted or escaped.
    quoted: tuple[tuple[int, int], ...]

    def quoted_after(self, colon: int) -> bool:
        """Whether a quoted part (an empty ``""`` too) lies after ``colon``."""
        return any(end > colon + 1 or start > colon for start, end in self.quoted)


def _words(text: str) -> list[_Word]:
    """``text`` split into words as a POSIX shell (and ``shlex.split``) splits it,
    keeping track of which parts were quoted: a quoted value is a string."""
    words: list[_Word] = []
    current: str | None = None
    quoted: list[tuple[int, int]] = []
    position = 0
    while position < len(text):
        char = text[position]
        if char.isspace():
            if current is not None:
                words.append(_Word(current, tuple(quoted)))
                current, quoted = None, []
            position += 1
            continue
        current = current or ""
        if char in "'\"":
            part, position = _quoted_part(text, position)
        elif char == "\\":
            if position + 1 == len(text):
                raise leaseq.InvalidArgument("payload filter: nothing after the last backslash")
            part, position = text[position + 1], position + 2
        else:
            current += char
            position += 1
            continue
        quoted.append((len(current), len(current) + len(part)))
        current += part
    if current is not None:
        words.append(_Word(current, tuple(quoted)))
    return words


def _quoted_part(text: str, position: int) -> tuple[str, int]:
    """What the quotes opening at ``position`` hold, and where they end. Within double
    quotes a backslash escapes ``"`` and itself; within single ones nothing."""
    mark = text[position]
    part: list[str] = []
    position += 1
    while position < len(text):
        char = text[position]
        if char == mark:
            return "".join(part), position + 1
        if mark == '"' and char == "\\" and text[position + 1 : position + 2] in ('"', "\\"):
            position += 1
            char = text[position]
        part.append(char)
        position += 1
    raise leaseq.InvalidArgument(f"payload filter: no closing quotation mark ({mark})")


# -- the Failed page's groups ------------------------------------------------------------


def _lines(text: str) -> str:
    # A browser's HTML parser reads a CR as LF, and it sends line breaks as CRLF: the
    # group's text comes back from its hidden field with other line breaks.
    return text.replace("\r\n", "\n").replace("\r", "\n")


def failed_group(error: str, digest: str = "") -> Callable[[leaseq.Job], bool]:
    """Whether a job is in the Failed page's group of ``error``: the first
    FAILED_GROUP_CHARS characters of its last error are the group's text, exactly
    (empty: jobs whose error text is empty or none, one group as in the SQL);
    ``find_jobs``' error filter is a substring. The page sends the text's
    ``digest`` (``group_digest``), which keeps apart texts that differ only in
    line breaks; without it, the text as a browser sends it back, line breaks
    aside."""
    if digest:
        return lambda job: group_digest((job.last_error or "")[:FAILED_GROUP_CHARS]) == digest
    wanted = _lines(error)

    def member(job: leaseq.Job) -> bool:
        return _lines((job.last_error or "")[:FAILED_GROUP_CHARS]) == wanted

    return member


def group_search(error: str) -> str | None:
    """Text that every error of the group of ``error`` holds (its first line), for
    ``find_jobs`` to narrow the search; None (no such filter) for the group
    without an error text."""
    return _lines(error).partition("\n")[0] or None


# -- queue settings -------------------------------------------------------------------

UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
# [0-9], not \d: \d is any script's digit, which float() reads too.
_DURATION = re.compile(r"([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*([smhdw]?)")


def seconds(text: str, what: str, *, forever: bool = False) -> float | None:
    """``90s``, ``15m``, ``2h``, ``1d``, a bare number of seconds; with ``forever``,
    ``never``/``forever`` (None)."""
    value = text.strip().lower()
    if forever and value in ("never", "forever"):
        return None
    match = _DURATION.fullmatch(value)
    if match is None:
        never = ", or never" if forever else ""
        raise leaseq.InvalidArgument(
            f"{what}: {text!r} is not a duration such as 90s, 15m, 2h, 1d{never}"
        )
    return float(match[1]) * UNITS[match[2] or "s"]


def integer(text: str, what: str, *, optional: bool = False) -> int | None:
    value = text.strip().replace(",", "").replace("_", "")
    if optional and value in ("", "none", "no limit"):
        return None
    if not digits(value.removeprefix("-")):
        empty = " (empty: no limit)" if optional else ""
        raise leaseq.InvalidArgument(f"{what}: {text!r} is not a whole number{empty}")
    return int(value)


def rate(text: str, what: str) -> tuple[int, float] | None:
    """``50/1s``, ``1000/1h`` (a bare ``50`` is per second); empty or ``none``: no limit."""
    value = text.strip().lower()
    if value in ("", "none", "no limit"):
        return None
    starts, _, per = value.partition("/")
    starts = starts.strip()
    if not digits(starts):
        raise leaseq.InvalidArgument(
            f"{what}: {text!r} is not STARTS/DURATION such as 50/1s (empty: no limit)"
        )
    period = seconds(per or "1s", what)
    assert period is not None
    return (int(starts), period)


#: The settings form's fields: name -> (label, how to read it).
SETTINGS_FIELDS: dict[str, str] = {
    "lease": "duration",
    "max_attempts": "integer",
    "backoff_base": "duration",
    "backoff_cap": "duration",
    "ordering_policy": "choice",
    "max_queued_jobs": "limit",
    "max_queued_bytes": "limit",
    "max_payload_bytes": "limit",
    "max_running": "limit",
    "max_running_per_group": "limit",
    "rate_limit": "rate",
    "rate_limit_per_group": "rate",
    "retain_done": "retention",
    "retain_cancelled": "retention",
    "retain_failed": "retention",
    "retention_mode": "choice",
    "retain_archived": "retention",
}


def settings_text(settings: leaseq.QueueSettings) -> dict[str, str]:
    """The form's values for the current settings."""
    shown: dict[str, str] = {}
    for name, kind in SETTINGS_FIELDS.items():
        value = getattr(settings, name)
        if kind in ("duration", "retention"):
            shown[name] = retention(value)
        elif kind == "limit":
            shown[name] = "" if value is None else str(value)
        elif kind == "rate":
            shown[name] = "" if value is None else f"{value[0]}/{retention(value[1])}"
        else:
            shown[name] = str(value)
    return shown


def edited(form: Mapping[str, str]) -> dict[str, str]:
    """The settings fields the operator edited: those whose text differs from what
    the form showed (its ``shown`` field). Compared with the settings as they are
    at the save instead, every field another operator changed meanwhile would
    count as edited, and the save would silently undo that change. A form
    without ``shown`` (a hand-made request) counts every field it sends."""
    try:
        shown = json.loads(form.get("shown", ""))
    except ValueError:
        shown = None
    fields = {name: text for name, text in form.items() if name in SETTINGS_FIELDS}
    if not isinstance(shown, dict):
        return fields
    return {
        name: text
        for name, text in fields.items()
        if not isinstance(shown.get(name), str) or text.strip() != shown[name].strip()
    }


def settings_changes(form: Mapping[str, str], current: leaseq.QueueSettings) -> dict[str, Any]:
    """The settings the form changes (only those), read as ``configure_queue`` wants."""
    changes: dict[str, Any] = {}
    for name, kind in SETTINGS_FIELDS.items():
        if name not in form:
            continue
        text = form[name]
        value: Any
        if kind == "duration":
            value = seconds(text, name)
        elif kind == "retention":
            value = seconds(text, name, forever=True)
        elif kind == "integer":
            value = integer(text, name)
        elif kind == "limit":
            value = integer(text, name, optional=True)
        elif kind == "rate":
            value = rate(text, name)
        else:
            value = text.strip()
        old = getattr(current, name)
        if str(value) != str(old) and value != old:
            changes[name] = value
    # The library checks the pair only when both are given; the form knows both.
    base = changes.get("backoff_base", current.backoff_base)
    cap = changes.get("backoff_cap", current.backoff_cap)
    if cap < base:
        raise leaseq.InvalidArgument("backoff_cap must be >= backoff_base")
    return changes
