"""The one wall clock: milliseconds since the epoch, the time base every process sharing a file must use.

Rules never read it themselves: it is the default of the injected ``clock`` that facades pass as ``now``.
"""

from __future__ import annotations

import time
from collections.abc import Callable

Clock = Callable[[], int]


def wall_clock_ms() -> int:
    """Milliseconds since the epoch."""
    return time.time_ns() // 1_000_000
