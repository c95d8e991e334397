"""Secrets leaseq was given, and text scrubbed of them before it leaves leaseq.

Every DSN leaseq is handed is passed to :func:`remember_dsn` (``config.database_url``
is the funnel); :func:`redact` then replaces its password wherever it appears,
whatever surrounds it, and also masks the common shapes any password takes in
error texts and logs (``password=…``, ``'password': '…'``, URL userinfo...),
whoever's it is.

DSNs are parsed here, without the driver, following libpq's rules (URL and
``key=value`` forms), so that even a DSN libpq refuses to parse is remembered:
libpq quotes such a DSN's password in its error message.

(A job's payload values are masked in texts about it by :mod:`._payload_masking`.)
"""

from __future__ import annotations

import json
import os
import re
import threading
from urllib.parse import quote, unquote

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


def remembered() -> tuple[str, ...]:
    """The forms of every secret remembered so far, longest first."""
    return _secrets


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
