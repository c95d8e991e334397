"""What every part of the store shares: the schema, its rendered SQL texts."""

from __future__ import annotations

from .. import _validate as validate
from .. import _validate_payloads as payload_checks
from .._statement import Rows, notify_channel, sql_text


def ignore(_: list[Rows]) -> None:
    """The decoder of an operation whose rows say nothing."""
    return None


class StoreBase:
    """The schema an operation is built for, and its SQL (``{schema}`` filled in)."""

    def __init__(
        self, schema: str = "leaseq", *, max_payload_bytes: int | None = None, notify: bool = True
    ) -> None:
        self.schema = validate.schema_name(schema)
        #: LISTEN/NOTIFY channel of this schema; enqueues send the queue's name on it.
        self.channel = notify_channel(self.schema)
        self._notify_channel = self.channel if notify else None
        #: Where completions and failures name their queues, for wait_result.
        self.results_channel = notify_channel(self.schema, "results")
        self.max_payload_bytes = (
            payload_checks.DEFAULT_MAX_PAYLOAD_BYTES
            if max_payload_bytes is None
            else payload_checks.payload_cap(max_payload_bytes)
        )
        self._quoted = f'"{self.schema}"'
        self._texts: dict[str, str] = {}

    def sql(self, name: str) -> str:
        text = self._texts.get(name)
        if text is None:
            text = self._texts[name] = self.render(sql_text(name))
        return text

    def render(self, text: str) -> str:
        return text.replace("{schema}", self._quoted)
