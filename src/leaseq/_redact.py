"""Secrets leaseq was given, and text scrubbed of them before it leaves leaseq.

Every DSN leaseq is handed is passed to :func:`remember_dsn` (``config.database_url``
is the funnel); :func:`redact` then replaces its password wherever it appears,
whatever surrounds it, and also masks the common shapes any password takes in
error texts and logs (``password=…``, ``'password': '…'``, URL userinfo...),
whoever's it is.

DSNs are parsed here, without the driver, following libpq's rules (URL and
``key=value`` forms), so that even a DSN libpq refuses to parse is remembered:
libpq quotes such a DSN's password in its error message.

:func:`without_payload` masks one job's payload values in a text about it: an
error a handler raised on its input often quotes that input (contract 7).
"""

from __future__ import annotations

import json
import os
import re
import threading
from collections.abc import Iterable, Iterator
from urllib.parse import quote, quote_plus, unquote

PLACEHOLDER = "***"

#: Shorter secrets are not replaced verbatim: one or two characters occur in
#: almost every text, so replacing them would shred every message while hiding
#: nothing (two printable characters are fewer than 10,000 guesses). From three
#: characters on, a verbatim occurrence is rare enough in an error text to be
#: worth masking. Short passwords are still masked in the shapes below.
MIN_SECRET_CHARS = 3

#: Keywords whose values libpq treats as secrets.
_SECRET_KEYWORDS = frozenset({"password", "sslpassword"})

#: Names that mark a value as a secret: a key (in a text, ``api_key=...``) or a
#: payload field (the dashboard's ``SECRET_FIELDS``) whose name contains one, in any
#: case, an ``_`` also read as ``-`` or nothing (``X-Api-Key``, ``apiKey``). One list
#: for both, so that what the job page hides is also kept out of error texts.
SECRET_NAMES: tuple[str, ...] = (
    "password",
    "passwd",
    "pwd",
    "secret",
    "token",
    "api_key",
    "apikey",
    "authorization",
    "credential",
    "private_key",
)

_lock = threading.Lock()
#: Longest first, so that a secret containing another is replaced as a whole.
#: Replaced as a whole tuple under the lock; readers take it without the lock.
_secrets: tuple[str, ...] = ()

# The shapes. Each is linear in the text: scans stop at a character that also
# starts the next possible match, and nothing can fail after an unbounded scan.
#
# URL userinfo: the password runs from the user's ':' to the last '@' before the
# authority ends (a '/' or a space). libpq stops at the first '@', and then reads
# the rest of a password holding a raw '@' as the host: up to the last one, so
# that none of it shows. (The scan backs up at most to the next '/' or space.)
_URL_PASSWORD = re.compile(r"(://[^:/@\s]*:)[^/\s]+@")
# key=value, key: value, 'key': 'value', "key":"value", key => value, where the
# key's name contains a secret name (PGPASSWORD, db_password, X-Api-Key,
# client_secret...). The lookahead reads each word once and the key is taken
# possessively: nothing is read twice when no separator follows. Its closing quote
# may be escaped (a dict's repr inside a string's repr, JSON in JSON).
_SECRET_NAME = "|".join(re.escape(name).replace("_", "[_-]?") for name in SECRET_NAMES)
_KEY = rf"""\b(?=\w*?(?:{_SECRET_NAME}))\w++(?:-\w++)?+(?:\\*['"])?\s*(?:=>?|:)\s*"""
# The value, masked whole: one in quotes (plain or escaped, as a repr in a repr has
# them) up to its closing quote, or to the end of a truncated text that lacks it;
# a bare one up to a delimiter (, ; & a line end, a closing bracket) or to the next
# key=value, so that ``password: correct horse battery`` leaves no word of it.
_VALUE = r"""
    (?P<escaped>\\+)(?P<quote>['"])(?:(?!(?P=escaped)(?P=quote)).)*+(?:(?P=escaped)(?P=quote))?
    | '(?:[^'\\]|\\.)*+'? | "(?:[^"\\]|\\.)*+"?
    | [^\s,;&)\]}]++ (?:[ \t]++ (?![\w.-]++[ \t]*+[=:]) [^\s,;&)\]}]++)*+
"""
_KEY_VALUE = re.compile(
    rf"(?P<key>{_KEY})(?P<value>{_VALUE})", re.IGNORECASE | re.VERBOSE | re.DOTALL
)
# An HTTP bearer token (RFC 6750's characters), wherever it is quoted.
_BEARER = re.compile(r"(\bbearer\s+)[\w.~+/-]++=*+", re.IGNORECASE)


def remember(secret: str) -> None:
    """Mask ``secret`` (and the escaped forms repr, JSON and URLs give it) from now on."""
    global _secrets  # noqa: PLW0603 - one process-wide registry, by design
    forms = {
        secret,
        repr(secret)[1:-1],
        json.dumps(secret)[1:-1],
        json.dumps(secret, ensure_ascii=False)[1:-1],
        quote(secret, safe=""),
    }
    forms = {form for form in forms if len(form) >= MIN_SECRET_CHARS}
    with _lock:
        if not forms.issubset(_secrets):
            _secrets = tuple(sorted(forms.union(_secrets), key=len, reverse=True))


def remember_dsn(dsn: str) -> None:
    """Remember the passwords in ``dsn``, and ``PGPASSWORD``, which libpq uses with it."""
    for secret in dsn_secrets(dsn):
        remember(secret)
    from_environment = os.environ.get("PGPASSWORD")
    if from_environment:
        remember(from_environment)


def redact(text: str) -> str:
    """``text`` without any remembered secret and without password-shaped values."""
    for secret in _secrets:
        if secret in text:
            text = text.replace(secret, PLACEHOLDER)
    text = _URL_PASSWORD.sub(rf"\1{PLACEHOLDER}@", text)
    text = _KEY_VALUE.sub(_mask_value, text)
    return _BEARER.sub(rf"\1{PLACEHOLDER}", text)


def _mask_value(match: re.Match[str]) -> str:
    value = match["value"]
    if match["escaped"]:
        quote_mark = match["escaped"] + match["quote"]
    else:
        quote_mark = value[0] if value[0] in "'\"" else ""
    return f"{match['key']}{quote_mark}{PLACEHOLDER}{quote_mark}"


# -- payload values ----------------------------------------------------------------------

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
    needles = {secret for secret in _secrets if len(secret) > 1}
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


# -- parsing DSNs ----------------------------------------------------------------------


def dsn_secrets(dsn: str) -> set[str]:
    """The secret values in a DSN, as written and as decoded, in URL or keyword form."""
    if re.match(r"\s*[A-Za-z][A-Za-z0-9+.-]*://", dsn):
        return _url_secrets(dsn.split("://", 1)[1])
    return _keyword_secrets(dsn)


def _url_secrets(rest: str) -> set[str]:
    found: set[str] = set()
    # libpq: credentials are what precedes the first '@', unless a '/' comes first.
    slash, at = rest.find("/"), rest.find("@")
    if at >= 0 and (slash < 0 or at < slash):
        found |= _userinfo_password(rest[:at])
    # urllib's reading (the last '@' before the query), in case the password holds a
    # raw '@' or '/': libpq then misreads the URL, and may quote parts of it.
    userinfo, separator, _ = rest.partition("?")[0].rpartition("@")
    if separator:
        found |= _userinfo_password(userinfo)
        found |= _misread_parts(userinfo.partition(":")[2])
    # Query parameters are libpq keywords too: ?password=...
    for parameter in rest.partition("?")[2].split("&"):
        key, separator, value = parameter.partition("=")
        if separator and unquote(key).strip().lower() in _SECRET_KEYWORDS:
            found |= {value, unquote(value)}
    return {secret for secret in found if secret}


#: Where libpq ends a URL's password, host, port or database name. A password
#: holding a raw '@' or '/' is cut there: libpq reads the rest as hosts (``h1,h2``),
#: ports and a database, and quotes those in its errors ("failed to resolve host").
_URL_DELIMITERS = re.compile(r"[@/:,?&=]")


def _misread_parts(password: str) -> set[str]:
    """The pieces of ``password`` (as written in the URL) libpq may quote when a raw
    '@' or '/' in it splits the URL elsewhere: each text between delimiters, and
    each rest after one; as written and decoded."""
    if "@" not in password and "/" not in password:
        return set()
    parts = set(_URL_DELIMITERS.split(password))
    parts |= {password[cut.end() :] for cut in _URL_DELIMITERS.finditer(password)}
    return parts | {unquote(part) for part in parts}


def _userinfo_password(userinfo: str) -> set[str]:
    _, colon, password = userinfo.partition(":")
    return {password, unquote(password)} if colon else set()


def _keyword_secrets(dsn: str) -> set[str]:
    """Secret values of ``key = value`` pairs, tokenised as libpq does: values are
    bare words or single-quoted, with backslash escapes in both."""
    found: set[str] = set()
    position, end = 0, len(dsn)
    while position < end:
        while position < end and dsn[position].isspace():
            position += 1
        start = position
        while position < end and not dsn[position].isspace() and dsn[position] != "=":
            position += 1
        key = dsn[start:position]
        while position < end and dsn[position].isspace():
            position += 1
        if position >= end or dsn[position] != "=":
            continue  # libpq refuses this DSN; read on for a later password=...
        position += 1
        while position < end and dsn[position].isspace():
            position += 1
        raw, value, position = _keyword_value(dsn, position)
        if key.lower() in _SECRET_KEYWORDS:
            found |= {raw, value}
    return {secret for secret in found if secret}


def _keyword_value(dsn: str, position: int) -> tuple[str, str, int]:
    """The value at ``position`` as written and as meant, and where it ends."""
    quoted = position < len(dsn) and dsn[position] == "'"
    start = position = position + 1 if quoted else position
    chars: list[str] = []
    while position < len(dsn):
        char = dsn[position]
        if (quoted and char == "'") or (not quoted and char.isspace()):
            break
        if char == "\\" and position + 1 < len(dsn):
            position += 1
            char = dsn[position]
        chars.append(char)
        position += 1
    raw = dsn[start:position]
    return raw, "".join(chars), position + 1 if quoted else position
