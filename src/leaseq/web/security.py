"""Who may do what, and the checks every request passes.

* :class:`Principal`: a name and permissions (``read``, ``replay``, ``cancel``,
  ``pause``, ``configure``); ``auth`` callables return one, or None (401).
* :class:`TokenAuth` (a bearer token; browsers log in once through a form that sets
  a signed cookie) and :class:`BasicAuth` (HTTP basic): what the CLI builds from
  its environment, usable by anyone mounting the app.
* CSRF: a random session cookie and, in every form, a token that is the HMAC of
  it under the app's secret; plus ``Origin`` and ``Sec-Fetch-Site`` checks.
* :class:`SecurityHeaders`: the strict CSP and friends on every response.
* :class:`TrustedHosts`: only the ``Host`` names given (``allowed_hosts``): a
  dashboard without auth on loopback is otherwise open to DNS rebinding, a page
  of another site whose name the attacker points at 127.0.0.1.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import secrets
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from starlette.requests import HTTPConnection, Request
from starlette.responses import PlainTextResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .forms import digits

READ, REPLAY, CANCEL, PAUSE, CONFIGURE = "read", "replay", "cancel", "pause", "configure"
#: Every permission the dashboard knows; a local dashboard without auth grants all.
PERMISSIONS: frozenset[str] = frozenset({READ, REPLAY, CANCEL, PAUSE, CONFIGURE})

SESSION_COOKIE = "leaseq_session"
LOGIN_COOKIE = "leaseq_login"
FLASH_COOKIE = "leaseq_flash"
#: How long a browser login through the token form lasts.
LOGIN_SECONDS = 12 * 3600

CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
HEADERS = {
    "content-security-policy": CSP,
    "x-content-type-options": "nosniff",
    "referrer-policy": "same-origin",
    "x-frame-options": "DENY",
    # Pages show live data: a cached copy would show the past (and a shared cache
    # would keep one principal's page for another).
    "cache-control": "no-store",
}


@dataclass(frozen=True, slots=True)
class Principal:
    """Someone using the dashboard: a name for the audit log and what they may do."""

    name: str
    #: Out of PERMISSIONS; no default, so that nobody grants everything by omission.
    permissions: frozenset[str]

    def can(self, permission: str) -> bool:
        return permission in self.permissions


#: ``auth``: a request in, a Principal (or None: not authenticated) out; sync or async.
Auth = Callable[[Request], "Principal | Awaitable[Principal | None] | None"]


def _digest(key: bytes, text: str) -> str:
    # surrogatepass: a form field may decode to a lone surrogate; it must give a
    # digest that matches nothing, not an error.
    return hmac.new(key, text.encode("utf-8", "surrogatepass"), hashlib.sha256).hexdigest()


def _same(given: str, expected: str) -> bool:
    """Constant-time comparison of a MAC someone sent with ours. As bytes:
    ``hmac.compare_digest`` raises TypeError on a ``str`` that is not ASCII, and a
    cookie or form field can hold anything."""
    return hmac.compare_digest(
        given.encode("utf-8", "surrogatepass"), expected.encode("utf-8", "surrogatepass")
    )


class TokenAuth:
    """A bearer token (``Authorization: Bearer ...``) or a login cookie signed with
    it: whoever knows the token gets ``permissions`` under ``name``. Changing the
    token ends every browser login."""

    login_form = True

    def __init__(
        self, token: str, *, name: str = "token", permissions: frozenset[str] = PERMISSIONS
    ) -> None:
        if len(token) < 16:
            raise ValueError("the dashboard token must be at least 16 characters long")
        self._key = token.encode()
        self.principal = Principal(name, permissions)

    def check_token(self, token: str) -> bool:
        """Whether ``token`` (text, as a form sends it) is the token."""
        return self._same_key(token.encode("utf-8", "surrogatepass"))

    def _same_key(self, given: bytes) -> bool:
        return hmac.compare_digest(given, self._key)

    def login_cookie(self, now: float | None = None) -> str:
        issued = str(int(time.time() if now is None else now))
        return f"{issued}.{_digest(self._key, 'login:' + issued)}"

    def _valid_cookie(self, value: str) -> bool:
        issued, _, mac = value.partition(".")
        if not digits(issued) or not _same(mac, _digest(self._key, "login:" + issued)):
            return False
        return 0 <= time.time() - int(issued) < LOGIN_SECONDS

    def __call__(self, request: Request) -> Principal | None:
        scheme, _, credentials = request.headers.get("authorization", "").partition(" ")
        # Starlette decodes header values as latin-1: encoded back, they are the
        # bytes the client sent (a token's UTF-8), which is what the key holds.
        if scheme.lower() == "bearer" and self._same_key(credentials.strip().encode("latin-1")):
            return self.principal
        cookie = request.cookies.get(LOGIN_COOKIE)
        if cookie and self._valid_cookie(cookie):
            return self.principal
        return None


class BasicAuth:
    """HTTP basic authentication against one user and password."""

    login_form = False

    def __init__(
        self, user: str, password: str, *, permissions: frozenset[str] = PERMISSIONS
    ) -> None:
        if not user or not password:
            raise ValueError("basic auth needs a user and a password")
        self._user = user.encode()
        self._password = password.encode()
        self.principal = Principal(user, permissions)

    def __call__(self, request: Request) -> Principal | None:
        scheme, _, encoded = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "basic":
            return None
        try:
            user, _, password = base64.b64decode(encoded.strip()).partition(b":")
        except (binascii.Error, ValueError):
            return None
        # Both compared, always: the time taken says nothing about which was wrong.
        user_ok = hmac.compare_digest(user, self._user)
        password_ok = hmac.compare_digest(password, self._password)
        return self.principal if user_ok and password_ok else None


# -- CSRF ---------------------------------------------------------------------------


class Csrf:
    """Session cookies and the form tokens bound to them, under one app's secret."""

    def __init__(self, secret: bytes | None = None) -> None:
        self._secret = secret or secrets.token_bytes(32)

    def token(self, session: str) -> str:
        return _digest(self._secret, "csrf:" + session)

    def valid(self, session: str | None, token: str | None) -> bool:
        if not session or not token:
            return False
        return _same(token, self.token(session))

    def sign(self, text: str) -> str:
        """``text`` with a MAC, for the flash cookie (what we set, we show)."""
        body = base64.urlsafe_b64encode(text.encode()).decode()
        return f"{body}.{_digest(self._secret, 'flash:' + body)}"

    def unsign(self, value: str) -> str | None:
        body, _, mac = value.partition(".")
        if not _same(mac, _digest(self._secret, "flash:" + body)):
            return None
        try:
            return base64.urlsafe_b64decode(body.encode()).decode()
        except (binascii.Error, UnicodeDecodeError):
            return None


def new_session() -> str:
    return secrets.token_urlsafe(32)


#: The port an origin without one means.
_DEFAULT_PORTS = {"http": 80, "https": 443}


def _origin(scheme: str, netloc: str) -> tuple[str, str, int | None] | None:
    """An origin as compared: scheme and host without case, the scheme's default
    port written out (a browser never writes it in ``Origin``; some proxies pass
    ``Host: name:443`` on). None for one that does not parse."""
    try:
        parts = urlsplit(f"//{netloc}")
        port = parts.port
    except ValueError:
        return None
    scheme = scheme.lower()
    return scheme, (parts.hostname or ""), _DEFAULT_PORTS.get(scheme) if port is None else port


def own_origin(request: HTTPConnection) -> tuple[str, str, int | None] | None:
    """The origin the browser addressed: scheme and Host of this request."""
    return _origin(request.url.scheme, request.headers.get("host", request.url.netloc))


def cross_site_reason(request: HTTPConnection) -> str | None:
    """Why a state-changing request looks cross-site, or None. Browsers send
    ``Origin`` on every POST and ``Sec-Fetch-Site`` with it; clients that send
    neither (curl with a token) are left to the CSRF token."""
    origin = request.headers.get("origin")
    if origin is not None:
        scheme, _, netloc = origin.partition("://")
        plain = netloc and not any(c in netloc for c in "/@?#")  # as browsers write it
        sent = _origin(scheme, netloc) if plain else None
        if sent is None or sent != own_origin(request):
            return f"the request came from another origin ({origin})"
    site = request.headers.get("sec-fetch-site")
    if site is not None and site not in ("same-origin", "none"):
        return f"the browser says the request is {site}"
    return None


def cookie_options(request: HTTPConnection) -> dict[str, Any]:
    """Our cookies live under the app's root only, out of reach of scripts."""
    return {
        "path": request.scope.get("root_path", "") or "/",
        "httponly": True,
        "secure": request.url.scheme == "https",
    }


class SecurityHeaders:
    """ASGI middleware: the CSP and the other security headers on every response
    (error pages and static files included)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        # Static files may be kept, if checked again (their ETag): pages may not.
        static = "/static/" in scope.get("path", "")

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                present = {name.lower() for name, _ in headers}
                headers += [
                    (
                        name.encode(),
                        b"no-cache" if static and name == "cache-control" else value.encode(),
                    )
                    for name, value in HEADERS.items()
                    if name.encode() not in present
                ]
                message["headers"] = headers
            await send(message)

        await self.app(scope, receive, send_with_headers)


def host_name(header: str) -> str:
    """The name of a ``Host`` header, its port and an IPv6 address's brackets
    removed, in lower case (``[::1]:8080`` -> ``::1``)."""
    header = header.strip().lower()
    if header.startswith("["):
        return header[1:].partition("]")[0]
    return header.rpartition(":")[0] if header.count(":") == 1 else header


class TrustedHosts:
    """ASGI middleware: a request whose ``Host`` is none of ``allowed`` gets a 400.

    A page of another site can make a browser send requests to 127.0.0.1 under
    its own name (DNS rebinding). They carry that name in ``Host``: refusing it
    keeps such a page from reading or acting on a dashboard that has no auth
    (its origin checks compare with ``Host``, which the attacker chose)."""

    def __init__(self, app: ASGIApp, allowed: Iterable[str]) -> None:
        self.app = app
        self.allowed = frozenset(host_name(name) for name in allowed)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        header = HTTPConnection(scope).headers.get("host", "")
        if host_name(header) not in self.allowed:
            refusal = PlainTextResponse(
                "This dashboard answers only to its own address "
                f"({', '.join(sorted(self.allowed))}).",
                status_code=400,
            )
            await refusal(scope, receive, send)
            return
        await self.app(scope, receive, send)
