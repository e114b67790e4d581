"""``canonical_json``: the stored form of a body, the same text ``json.dumps`` with the canonical options
gives, and a ``ValueError`` for anything that is not strict JSON, cycles included (its encoder is built
once and keeps no cycle markers between calls)."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from asyncq.core import jsontext
from asyncq.core.jsontext import canonical_json

JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=20,
)


def reference(value: object) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)


@settings(max_examples=300, deadline=None)
@given(JSON_VALUES)
def test_canonical_json_is_the_canonical_dumps(value: object) -> None:
    assert canonical_json(value) == reference(value)


def test_key_order_and_whitespace_never_make_two_bodies_differ() -> None:
    assert canonical_json({"b": [1, 2.5, "é"], "a": None}) == '{"a":null,"b":[1,2.5,"\\u00e9"]}'
    assert canonical_json(json.loads('{ "a" : null , "b" : [1, 2.5, "\\u00e9"] }')) == canonical_json(
        {"b": [1, 2.5, "é"], "a": None}
    )


def cycle() -> list[Any]:
    looped: list[Any] = []
    looped.append(looped)
    return looped


@pytest.mark.parametrize(
    "value",
    [math.nan, math.inf, {1, 2}, {"x": b"bytes"}, {1: "a", "b": 2}, object(), cycle()],
    ids=["nan", "inf", "set", "bytes", "mixed-keys", "object", "cycle"],
)
def test_what_is_not_strict_json_is_a_value_error_and_the_encoder_stays_usable(value: object) -> None:
    with pytest.raises(ValueError):
        canonical_json(value)
    # Nothing of the refused value stays behind: the next body encodes as usual.
    nested: Any = {"k": [{"k": [1]}]}
    assert canonical_json(nested) == '{"k":[{"k":[1]}]}'


def test_cpython_uses_the_encoder_built_once() -> None:
    # Not a speed test: a changed signature of json's undocumented C encoder must fall back visibly, here.
    assert jsontext._canonical_chunks is not None


@pytest.mark.parametrize("value", [{"b": [1, 2.5, "é"], "a": None}, [], "x", 0])
def test_without_the_c_encoder_the_fallback_gives_the_same_text(value: object, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(jsontext, "_canonical_chunks", None)
    assert canonical_json(value) == reference(value)
    for refused in (math.nan, {1, 2}, cycle()):
        with pytest.raises(ValueError):
            canonical_json(refused)
