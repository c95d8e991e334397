"""Payloads, results and payload filters as the compact JSON text leaseq stores:
one encoder for all, and the one case JSON would get silently wrong refused."""

from __future__ import annotations

import json

#: One encoder for every payload (json.dumps with options builds one per call).
#: Sorting the keys costs next to nothing (jsonb stores them sorted anyway) and
#: refuses, with a TypeError, a mapping whose keys mix text and other types: the
#: only mappings whose keys can collide once JSON makes them text ({1: …, "1": …}:
#: jsonb would keep one of the two values, silently). Those take the careful path.
_PAYLOAD_ENCODER = json.JSONEncoder(
    ensure_ascii=False, allow_nan=False, separators=(",", ":"), sort_keys=True
)
_UNSORTED_ENCODER = json.JSONEncoder(ensure_ascii=False, allow_nan=False, separators=(",", ":"))


def json_text(value: object) -> str:
    """``value`` as compact JSON; a ValueError if two keys of one mapping would
    become the same JSON text."""
    try:
        return _PAYLOAD_ENCODER.encode(value)
    except TypeError:
        pass  # keys of mixed types, or a value JSON cannot hold: look closer
    _refuse_colliding_keys(value)
    return _UNSORTED_ENCODER.encode(value)


def _json_key(key: object) -> object:
    """A mapping key as the JSON encoder writes it (others: left for it to refuse)."""
    if key is True or key is False or key is None:
        return json.dumps(key)
    if isinstance(key, int | float) and not isinstance(key, bool):
        return float.__repr__(key) if isinstance(key, float) else int.__repr__(key)
    return key


def _refuse_colliding_keys(value: object) -> None:
    containers, seen = [value], 0
    while containers:
        current = containers.pop()
        seen += 1
        if seen > 1_000_000:  # a cycle or an absurd payload: the encoder refuses it
            return
        if isinstance(current, dict):
            texts = {_json_key(k) for k in current}
            if len(texts) < len(current):
                keys = sorted(map(repr, current))
                raise ValueError(f"keys that become the same JSON text: {', '.join(keys)}")
            containers.extend(current.values())
        elif isinstance(current, list | tuple):
            containers.extend(current)
