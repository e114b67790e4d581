"""What the operator's console samples and keeps in the store (no I/O): each queue's figures at one moment, the
workers it saw holding leases, and the rules for both (how renewals are told from two looks at the leases, how
long samples are kept).

A running console reads every queue's figures every ``sample_every`` and writes them as one sample (a row per
queue) in the store, so that its charts keep their history across restarts and every console of a store shows
the same; a sample is skipped when another console wrote one less than half an interval ago. Samples older than
the console's ``keep`` are deleted as new ones are written, so the table stays bounded.

A queue's figures: its pending jobs (counted up to ``DEPTH_CAP``; ``capped`` says so), how many of them are ready,
its leased jobs, when its oldest ready job became ready, and since the previous sample the jobs that ended done,
ended dead and the attempts that failed (0 in a store's first sample: there is no interval yet).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from asyncq.core.limits import DAY_MS, SECOND_MS
from asyncq.core.stats import OwnerLeases, Stats

#: Pending (and ready, and leased) jobs of one queue a sample counts, at most.
DEPTH_CAP = 1_000_000
#: Failed attempts since the previous sample that a sample counts, at most.
FAILURES_CAP = 1_000_000
DEFAULT_SAMPLE_MS = 10 * SECOND_MS
DEFAULT_KEEP_MS = 7 * DAY_MS
MIN_SAMPLE_MS = 50
MAX_KEEP_MS = 366 * DAY_MS


@dataclass(frozen=True)
class Totals:
    """What the console shows of the whole store on every refresh: ``core.stats.Stats`` without the attempts
    histogram, which a PostgreSQL store reads from every live row (``Totals.of`` is the definition)."""

    now_ms: int
    by_status: dict[str, int]
    dead_by_reason: dict[str, int]
    oldest_ready_age_ms: int | None
    expired_leases: int
    leases: list[OwnerLeases]

    @classmethod
    def of(cls, stats: Stats) -> Totals:
        return cls(
            stats.now_ms, stats.by_status, stats.dead_by_reason, stats.oldest_ready_age_ms, stats.expired_leases,
            stats.leases,
        )  # fmt: skip


@dataclass(frozen=True)
class QueueFigures:
    """One queue's figures in one sample (see the module's docstring)."""

    queue: str
    pending: int
    ready: int
    leased: int
    oldest_ready_at: int | None
    done: int
    dead: int
    failed: int
    capped: bool = False

    def oldest_ready_age_ms(self, at_ms: int) -> int | None:
        """How long the oldest ready job had waited at ``at_ms``."""
        return None if self.oldest_ready_at is None else max(0, at_ms - self.oldest_ready_at)


@dataclass(frozen=True)
class LeaseSeen:
    """A lease as a sample saw it."""

    owner: str
    job_id: str
    token: int
    lease_until: int


@dataclass(frozen=True)
class Figures:
    """What one look at the store found: every queue's figures, the newest failed attempt's number (the next
    sample counts the failures after it) and the leases held."""

    at_ms: int
    queues: list[QueueFigures]
    errors_seq: int
    leases: list[LeaseSeen]


@dataclass(frozen=True)
class Sample:
    """A sample as kept: when, and every queue's figures."""

    at_ms: int
    queues: list[QueueFigures]


@dataclass(frozen=True)
class WorkerSeen:
    """A lease holder as the console saw it: first and last seen holding a lease, the leases it held when last
    seen, the renewals seen (a lease whose expiry moved on between two samples, same token) and the last one."""

    owner: str
    first_seen_ms: int
    last_seen_ms: int
    leases: int
    renewals: int
    last_renewal_ms: int | None


@dataclass(frozen=True)
class WorkerLook:
    """What one sample saw of one owner: the leases it holds and the renewals since the previous sample."""

    owner: str
    leases: int
    renewals: int


def look_at_workers(before: Mapping[tuple[str, int], int], leases: Iterable[LeaseSeen]) -> list[WorkerLook]:
    """Each owner's leases and renewals: a renewal is a lease held under the same job and token at both looks
    whose expiry moved on (``before``: ``(job id, token) -> lease_until`` at the previous look)."""
    held: Counter[str] = Counter()
    renewed: Counter[str] = Counter()
    for lease in leases:
        held[lease.owner] += 1
        previous = before.get((lease.job_id, lease.token))
        if previous is not None and lease.lease_until > previous:
            renewed[lease.owner] += 1
    return [WorkerLook(owner, held[owner], renewed[owner]) for owner in sorted(held)]


def lease_map(leases: Iterable[LeaseSeen]) -> dict[tuple[str, int], int]:
    """``(job id, token) -> lease_until`` for the next look."""
    return {(lease.job_id, lease.token): lease.lease_until for lease in leases}


def is_due(newest_ms: int | None, now_ms: int, every_ms: int) -> bool:
    """Whether a sample is due: none was written less than half an interval ago (by this console or another)."""
    return newest_ms is None or now_ms - newest_ms >= every_ms // 2
