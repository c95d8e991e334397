"""The leaseq dashboard: ``create_app(queue)`` is an ASGI app to serve (``leaseq
dashboard``) or mount in your own Starlette/FastAPI app. Needs the ``web`` extra.

It reads and acts only through the library (no SQL of its own); see
docs/dashboard.md for auth, permissions and what it keeps safe."""

from .._secret_fields import SECRET_FIELDS
from .app import create_app
from .security import PERMISSIONS, BasicAuth, Principal, TokenAuth

__all__ = ["PERMISSIONS", "SECRET_FIELDS", "BasicAuth", "Principal", "TokenAuth", "create_app"]
