"""A payload as operators may see it: the values of its secret fields hidden, at
any depth, and password shapes scrubbed from its texts. The dashboard's job page
and ``leaseq job`` show a payload through the same mask (no extra needed here)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from typing import Any

from ._redact import SECRET_NAMES, redact

#: Payload fields whose values are never shown: a field whose name, lowercased and
#: without separators, contains one of these. The names whose values leaseq also
#: masks in error texts and logs (``key=value``): one list.
SECRET_FIELDS: tuple[str, ...] = SECRET_NAMES
MASK = "••••••"
_SEPARATORS = re.compile(r"[^a-z0-9]")


def _normal(name: str) -> str:
    return _SEPARATORS.sub("", name.lower())


class SecretMask:
    """Decides which field names are secret and masks them, at any depth; scrubs
    password shapes (``scheme://user:password@``, ``password=...``) from text."""

    def __init__(self, fields: Iterable[str] = SECRET_FIELDS) -> None:
        self._parts = tuple({_normal(f) for f in fields if _normal(f)})

    def secret(self, name: str) -> bool:
        normal = _normal(name)
        return any(part in normal for part in self._parts)

    def mask(self, value: Any) -> Any:
        if isinstance(value, dict):
            return {
                key: MASK if self.secret(str(key)) else self.mask(item)
                for key, item in value.items()
            }
        if isinstance(value, list | tuple):
            return [self.mask(item) for item in value]
        if isinstance(value, str):
            # A DSN (or another password shape) quoted in a value keeps its
            # password out of the page, as leaseq keeps it out of logs and errors.
            return redact(value)
        return value

    def pretty(self, value: Any) -> str:
        """The masked value as indented JSON."""
        return json.dumps(self.mask(value), indent=2, ensure_ascii=False, default=str)
