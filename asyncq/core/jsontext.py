"""JSON as asyncq reads and compares it: strict on the way in, canonical for "is it the same body?".

Strict means UTF-8, no NaN/Infinity, no repeated keys, bounded nesting: what a receiver's ACK or an event
must be to count as evidence. Canonical means sorted keys, compact separators and ASCII escapes, so key
order and whitespace never make two bodies differ (while ``1`` and ``1.0`` still do).
"""

from __future__ import annotations

import json
from typing import Any


def _no_constant(name: str) -> Any:
    raise ValueError(f"JSON constant {name} is not allowed")


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result = dict(pairs)
    if len(result) != len(pairs):
        raise ValueError("a JSON object repeats a key")
    return result


# Built once: ``json.loads``/``json.dumps`` with options build a new decoder/encoder on every call.
_STRICT = json.JSONDecoder(parse_constant=_no_constant, object_pairs_hook=_unique_keys)
_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)


def loads_strict(raw: bytes) -> Any:
    """Parse strict UTF-8 JSON; anything else (bad UTF-8, NaN, a repeated key, deep nesting) is ``ValueError``."""
    try:
        return _STRICT.decode(raw.decode("utf-8"))
    except RecursionError:
        raise ValueError("JSON nested too deeply") from None


def canonical_json(value: object) -> str:
    """The canonical text of a JSON value; ``ValueError`` if it is not strict JSON (NaN, a set, a cycle …)."""
    try:
        return _CANONICAL.encode(value)
    except (TypeError, RecursionError) as error:
        raise ValueError(f"not JSON-serialisable: {error}") from None
