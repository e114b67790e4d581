"""Capped exponential backoff with a caller-supplied jitter ratio (no randomness, no sleeping here)."""

from __future__ import annotations

import math

from asyncq.core.values import check_int, check_ratio


def retry_delay(attempt: int, base_ms: int, cap_ms: int, jitter: float) -> int:
    """``floor(min(cap_ms, base_ms * 2**(attempt-1)) * jitter)`` milliseconds.

    ``attempt`` 1-16, ``base_ms`` 1-60000, ``cap_ms`` ``base_ms``-60000, ``jitter`` a finite int or float in
    0-1 (the caller draws it: full jitter with ``random.random()``, none with ``1``). Bad input: ``ValueError``.
    """
    check_int(attempt, "attempt", 1, 16)
    check_int(base_ms, "base_ms", 1, 60_000)
    check_int(cap_ms, "cap_ms", base_ms, 60_000)
    check_ratio(jitter, "jitter")
    scaled: int = math.floor(min(cap_ms, base_ms * 2 ** (attempt - 1)) * jitter)
    return scaled
