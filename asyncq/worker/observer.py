"""What a worker pool reports as it works: running totals, and the observer hook metrics plug into."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol


@dataclass
class PoolCounters:
    """Running totals, for logs, tests and the metrics endpoint."""

    claimed: int = 0
    finished: dict[str, int] = field(default_factory=dict)
    stale_finishes: int = 0
    leases_lost: int = 0
    handler_errors: int = 0
    commits: int = 0
    #: Failures of the pool's own machinery (never a handler's): logged at ERROR, each one survived.
    internal_errors: int = 0
    #: Store calls that found another process holding the lock past the busy timeout (retried).
    store_busy: int = 0
    #: Cancel requests (``Queue.cancel``) this pool's renewals found on jobs it held.
    cancels_requested: int = 0
    #: Handlers this pool cancelled on such a request (their jobs finished dead, reason ``cancelled``).
    cancelled: int = 0
    #: Jobs this pool's retention step removed, by retention state (``done``, ``cancelled``, ``dead``), and its runs.
    retention_removed: dict[str, int] = field(default_factory=dict)
    retention_runs: int = 0
    #: Ticks of the store's schedules this pool's keeper evaluated: ``fired`` (a job each), ``skipped``, ``missed``.
    schedule_ticks: dict[str, int] = field(default_factory=dict)

    def count_status(self, status: str | None) -> None:
        if status is None:
            self.stale_finishes += 1
        else:
            self.finished[status] = self.finished.get(status, 0) + 1


class PoolObserver(Protocol):
    """What a pool reports as it works (``asyncq.web.metrics.PoolMetrics`` is one). Called on the event loop:
    each method must return at once and never raise. An observer may also have ``on_retention(state, jobs)``
    (optional, so that observers written before it still fit): jobs its retention step removed in ``state``."""

    def on_claimed(self, count: int) -> None: ...

    def on_finished(self, outcome: str, status: str | None) -> None: ...

    def on_delivery(self, seconds: float, outcome: str) -> None: ...

    def on_lease_lost(self) -> None: ...

    def on_store_busy(self) -> None: ...


class NoObserver:
    """The observer of a pool that was given none: it ignores everything."""

    def on_claimed(self, count: int) -> None:
        pass

    def on_finished(self, outcome: str, status: str | None) -> None:
        pass

    def on_delivery(self, seconds: float, outcome: str) -> None:
        pass

    def on_lease_lost(self) -> None:
        pass

    def on_store_busy(self) -> None:
        pass
