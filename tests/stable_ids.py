"""Test ids that are the same in every process: ``pytest -n`` (xdist) collects in each worker and refuses ids that
differ, as a repr with an address (``<object object at 0x7f…>``) does."""

from __future__ import annotations

import re

_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")


def stable_repr(value: object) -> str:
    """``repr(value)`` without the memory addresses in it."""
    return _ADDRESS.sub("", repr(value))
