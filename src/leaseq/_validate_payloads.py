"""Checks of payloads and results, as leaseq stores them: compact JSON that
jsonb takes, within the caps, nested no deeper than Python decodes safely."""

from __future__ import annotations

import re
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from ._errors import InvalidArgument, InvalidJob, InvalidResult, PayloadTooLarge
from ._json_text import json_text
from ._validate import is_unicode, per_claim, positive_int

#: leaseq's own payload cap; queues may set a lower one.
DEFAULT_MAX_PAYLOAD_BYTES = 1024 * 1024
#: The largest payload cap a client or queue may set: jsonb holds no string, and
#: no container's elements, past 2^28 - 1 bytes.
MAX_PAYLOAD_BYTES_CAP = 2**28 - 1
#: How deep a payload (or result) may nest. Python decodes JSON recursively, and a
#: worker decodes a claim's payloads deep in its own stack, after the claim has
#: committed: a payload its producer could still encode (near the recursion limit)
#: took down every worker that claimed it, with the jobs claimed beside it.
MAX_PAYLOAD_DEPTH = 256
#: The most payload bytes one enqueue_many may carry: PostgreSQL takes no message
#: over 1 GiB, and a batch's payloads go as one text array, in which quotes and
#: backslashes are escaped (up to twice the bytes). Past it the server closed the
#: connection (the caller's transaction with it).
MAX_BATCH_BYTES = 256 * 1024 * 1024
#: The most digits of an integer Python decodes by default. A process that raised
#: its own limit (``sys.set_int_max_str_digits``) encodes longer ones, and jsonb
#: takes them; every reader with the default limit then failed to decode the
#: payload with a ValueError (``get()``; a claim, after it had committed: the
#: jobs claimed beside it stranded as running, then claimed again to fail again).
MAX_INT_DIGITS = sys.int_info.default_max_str_digits


# A \u0000 escape is one preceded by an even number of backslashes.
_NUL_ESCAPE = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")


@dataclass(frozen=True, slots=True)
class EncodedPayload:
    text: str
    size: int


def payload_batch(values: object) -> Iterable[object]:
    """enqueue_many's payloads: a collection of them. A string or a mapping is
    iterable too, and would have become one job per character or key."""
    if isinstance(values, str | bytes | bytearray | memoryview | Mapping) or not isinstance(
        values, Iterable
    ):
        raise InvalidJob(
            f"payloads must be a list (or other iterable) of payloads, got {type(values).__name__}"
        )
    return values


def per_payload(values: object, count: int, what: str) -> Sequence[object]:
    """A list of one value per payload (seqs, unique_keys)."""
    if isinstance(values, str | bytes | bytearray) or not isinstance(values, Sequence):
        raise InvalidJob(f"{what} must be a list with one entry per payload")
    if len(values) != count:
        raise InvalidJob(f"{what} must have one entry per payload ({count}), got {len(values)}")
    return values


def payload(value: object, limit: int) -> EncodedPayload:
    """Encode a payload as compact JSON and check what PostgreSQL would refuse."""
    try:
        text = json_text(value)
    except (TypeError, ValueError, RecursionError) as exc:
        raise InvalidJob(f"payload is not JSON-serialisable: {exc}") from None
    # The regular expression only where a \u0000 escape may be (the plain test is
    # a fraction of its cost, on every payload).
    if "\\u0000" in text and _NUL_ESCAPE.search(text):
        raise InvalidJob("payload contains a NUL character, which PostgreSQL's jsonb refuses")
    try:
        size = len(text.encode())
    except UnicodeEncodeError:
        raise InvalidJob("payload contains text that is not valid Unicode") from None
    if size > limit:
        raise PayloadTooLarge(f"payload is {size} bytes; the limit is {limit}")
    # Only a text with more brackets than the bound can nest past it (counted at
    # C speed; most payloads have a handful).
    if text.count("[") + text.count("{") > MAX_PAYLOAD_DEPTH and _deeper_than(
        value, MAX_PAYLOAD_DEPTH
    ):
        raise InvalidJob(f"payload nests deeper than {MAX_PAYLOAD_DEPTH} levels")
    # Under the default limit the encoder itself refuses a longer integer.
    if size > MAX_INT_DIGITS and _encodes_longer_ints() and _holds_longer_int(value):
        raise InvalidJob(
            f"payload holds an integer of more than {MAX_INT_DIGITS} digits, more than "
            "Python decodes by default (sys.set_int_max_str_digits): send it as a string"
        )
    return EncodedPayload(text, size)


def _encodes_longer_ints() -> bool:
    """Whether this process encodes integers longer than readers decode by default."""
    limit = sys.get_int_max_str_digits()
    return limit == 0 or limit > MAX_INT_DIGITS


def _holds_longer_int(value: object) -> bool:
    """Whether an int (not a mapping's key: JSON makes that text) somewhere in
    ``value`` has more than MAX_INT_DIGITS digits."""
    # An int of d digits has at least 3.32 (d - 1) bits: the bit count passes
    # most ints over without writing them out.
    bits = 3 * MAX_INT_DIGITS
    pending = [value]
    while pending:
        current = pending.pop()
        if isinstance(current, bool):
            continue
        if isinstance(current, int):
            if current.bit_length() > bits and len(int.__repr__(abs(current))) > MAX_INT_DIGITS:
                return True
        elif isinstance(current, dict):
            pending.extend(current.values())
        elif isinstance(current, list | tuple):
            pending.extend(current)
    return False


_CONTAINERS = (dict, list, tuple)


def _deeper_than(value: object, bound: int) -> bool:
    """Whether ``value``'s lists and mappings nest more than ``bound`` deep. Only
    containers are descended into, and never past ``bound``: as fast as encoding
    the payload, or faster, whatever its shape."""
    try:
        return isinstance(value, _CONTAINERS) and _nests_past(value, 1, bound)
    except RecursionError:  # a caller already deep in its stack: refused as too deep
        return True


def _nests_past(container: object, level: int, bound: int) -> bool:
    if level > bound:
        return True
    children: Iterable[object] = (
        container.values() if isinstance(container, dict) else container  # type: ignore[assignment]
    )
    for child in children:
        if isinstance(child, _CONTAINERS) and _nests_past(child, level + 1, bound):
            return True
    return False


def batch_size(sizes: Iterable[int]) -> int:
    """The bytes of a batch's payloads, refused past what one statement carries."""
    total = sum(sizes)
    if total > MAX_BATCH_BYTES:
        raise PayloadTooLarge(
            f"the batch's payloads are {total} bytes; one enqueue_many carries at most "
            f"{MAX_BATCH_BYTES} (PostgreSQL's message limit): enqueue them in smaller batches"
        )
    return total


#: A job result's cap unless its task says otherwise (``max_result_bytes``).
DEFAULT_MAX_RESULT_BYTES = 64 * 1024


def result(value: object, limit: int = DEFAULT_MAX_RESULT_BYTES) -> EncodedPayload | None:
    """A handler's return value as its job's result (None: no result): compact
    JSON, at most ``limit`` bytes; one already encoded passes as it is."""
    if value is None or isinstance(value, EncodedPayload):
        return value
    try:
        encoded = payload(value, limit)
    except PayloadTooLarge as exc:
        reason = str(exc).replace("payload", "the result")
        raise InvalidResult(f"result too large: {reason}") from None
    except InvalidJob as exc:
        reason = str(exc).replace("payload", "result")
        raise InvalidResult(f"result cannot be stored: {reason}") from None
    return encoded


def results(values: Sequence[object] | None, count: int) -> list[str | None] | None:
    """A batch's results as JSON texts, None for the whole batch when it has none."""
    if values is None:
        return None
    values = per_claim(values, "results")
    if len(values) != count:
        raise InvalidArgument(f"results must have one entry per claim ({count}), got {len(values)}")
    encoded = [result(v) for v in values]
    if all(e is None for e in encoded):
        return None
    return [None if e is None else e.text for e in encoded]


def payload_cap(value: object) -> int:
    """A client's ``max_payload_bytes``: no more than jsonb can hold."""
    cap = positive_int(value, "max_payload_bytes")
    if cap > MAX_PAYLOAD_BYTES_CAP:
        raise InvalidArgument(
            f"max_payload_bytes must be at most {MAX_PAYLOAD_BYTES_CAP} (what jsonb holds), "
            f"got {cap}"
        )
    return cap


def payload_filter(value: object) -> str | None:
    """A JSON object the payload must contain (its fields, nested ones too)."""
    if value is None:
        return None
    if not isinstance(value, Mapping) or not value:
        raise InvalidArgument(f"payload filter must be a non-empty mapping, got {value!r}")
    try:
        text = json_text(value)
    except (TypeError, ValueError, RecursionError) as exc:
        raise InvalidArgument(f"payload filter is not JSON-serialisable: {exc}") from None
    if not is_unicode(text):
        raise InvalidArgument("payload filter contains text that is not valid Unicode")
    if "\\u0000" in text and _NUL_ESCAPE.search(text):
        raise InvalidArgument(
            "payload filter contains a NUL character, which PostgreSQL's jsonb refuses"
        )
    return text
