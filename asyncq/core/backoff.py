"""Capped exponential backoff with a caller-supplied jitter ratio (no randomness, no sleeping in the rule), and
the product's ``RetryPolicy`` that draws the jitter.

``backoff_ms`` is the one rule; ``retry_delay`` is the lease lab's contract of it (its narrower bounds), and
``RetryPolicy`` the product's (a cap up to ``MAX_RETRY_CAP_MS``, attempts up to ``MAX_ATTEMPTS``).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field

from asyncq.core.limits import (
    DEFAULT_RETRY_BASE_MS,
    DEFAULT_RETRY_CAP_MS,
    LAB_MAX_ATTEMPTS,
    LAB_RETRY_MAX_MS,
    MAX_ATTEMPTS,
    MAX_RETRY_BASE_MS,
    MAX_RETRY_CAP_MS,
)
from asyncq.core.values import Duration, check_int, check_ratio, duration_ms
from asyncq.errors import Retryable


def backoff_ms(attempt: int, base_ms: int, cap_ms: int, jitter: float) -> int:
    """``floor(min(cap_ms, base_ms * 2**(attempt-1)) * jitter)``; arguments already checked."""
    # 2**(attempt-1) for attempt up to 1000 is an exact int; min() keeps the product small before the float.
    return math.floor(min(cap_ms, base_ms << (attempt - 1)) * jitter)


def retry_delay(attempt: int, base_ms: int, cap_ms: int, jitter: float) -> int:
    """The lease lab's rule: ``floor(min(cap_ms, base_ms * 2**(attempt-1)) * jitter)`` milliseconds.

    ``attempt`` 1-16, ``base_ms`` 1-60000, ``cap_ms`` ``base_ms``-60000, ``jitter`` a finite int or float in
    0-1 (the caller draws it: full jitter with ``random.random()``, none with ``1``). Bad input: ``ValueError``.
    """
    check_int(attempt, "attempt", 1, LAB_MAX_ATTEMPTS)
    check_int(base_ms, "base_ms", 1, LAB_RETRY_MAX_MS)
    check_int(cap_ms, "cap_ms", base_ms, LAB_RETRY_MAX_MS)
    check_ratio(jitter, "jitter")
    return backoff_ms(attempt, base_ms, cap_ms, jitter)


@dataclass(frozen=True)
class RetryPolicy:
    """Capped, jittered exponential backoff for failed attempts (``backoff_ms``'s rule).

    ``base`` (default 1 s, at most an hour) and ``cap`` (default 60 s, ``base`` to 7 days) are seconds or a
    ``timedelta``; ``base_ms``/``cap_ms`` are the resolved values in milliseconds. ``jitter`` draws a ratio in 0-1
    for each retry: random by default (full jitter), injectable for tests. A bad policy is
    ``ValueError`` when it is built."""

    base: Duration | None = None
    cap: Duration | None = None
    jitter: Callable[[], float] = random.random
    base_ms: int = field(init=False)  #: ``base`` in milliseconds, resolved when the policy is built
    cap_ms: int = field(init=False)  #: ``cap`` in milliseconds

    def __post_init__(self) -> None:
        base = duration_ms(self.base, "base", DEFAULT_RETRY_BASE_MS, 1, MAX_RETRY_BASE_MS)
        cap_default = max(DEFAULT_RETRY_CAP_MS, base)
        cap = duration_ms(self.cap, "cap", cap_default, base, MAX_RETRY_CAP_MS)
        if not callable(self.jitter):
            raise ValueError("jitter must be a callable returning a ratio in 0-1")
        for name, value in (("base", base / 1000), ("cap", cap / 1000), ("base_ms", base), ("cap_ms", cap)):
            object.__setattr__(self, name, value)  # one form whichever was given: equal policies compare equal

    def delay_ms(self, attempt: int, error: BaseException | None = None) -> int:
        """The delay before the attempt after ``attempt`` (1 …); a ``Retryable(delay_ms=…)`` asks for one (e.g.
        from ``Retry-After``), honoured up to the cap. A jitter outside 0-1 is ``ValueError``."""
        if isinstance(error, Retryable) and error.delay_ms is not None:
            return max(0, min(error.delay_ms, self.cap_ms))
        ratio = check_ratio(self.jitter(), "jitter()")
        return backoff_ms(min(max(attempt, 1), MAX_ATTEMPTS), self.base_ms, self.cap_ms, ratio)
