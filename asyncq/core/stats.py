"""What an operator reads about a queue: the value types every store returns for stats, the one function that
assembles them from a store's reads, and their definition from a full listing (no I/O here).

A driver reads its figures in one snapshot, however its schema keeps them (kept counts, indexes), and passes
them as ``StatsReads`` rows to ``assemble_stats``. ``stats_of_jobs`` defines every figure from the rows
themselves; the conformance suite checks that each store's ``stats()`` equals it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NamedTuple

from asyncq.core.lifecycle import DEAD, LEASED, PENDING, STATUSES

if TYPE_CHECKING:
    from asyncq.core.jobs import Job


@dataclass(frozen=True)
class OwnerLeases:
    """Leases one owner holds, and the earliest of them to expire."""

    owner: str
    count: int
    first_expiry_ms: int


@dataclass(frozen=True)
class Stats:
    """A snapshot of one queue: every figure read in one transaction, so they agree with each other."""

    now_ms: int
    by_status: dict[str, int]
    dead_by_reason: dict[str, int]
    oldest_ready_age_ms: int | None
    expired_leases: int
    leases: list[OwnerLeases] = field(default_factory=list)
    attempts: dict[int, int] = field(default_factory=dict)

    @property
    def total(self) -> int:
        """Every job the store holds."""
        return sum(self.by_status.values())


class StatsReads(NamedTuple):
    """What a driver reads for ``Stats`` in one snapshot, as rows in which a key may repeat (its jobs are summed):
    ``counts`` ``(status, reason, jobs)`` of every job; ``attempts`` ``(attempts, jobs)`` of the pending and leased
    ones; ``leases`` ``(owner, jobs, first lease_until)`` of the leased ones, in the order to list the owners;
    ``expired`` the leased jobs whose lease has expired; ``oldest_ready`` the least ``available_at`` of a ready
    pending job (``None``: none is ready)."""

    counts: Iterable[tuple[str, str | None, int]]
    attempts: Iterable[tuple[int, int]]
    leases: Iterable[tuple[str, int, int]]
    expired: int
    oldest_ready: int | None


def assemble_stats(now_ms: int, reads: StatsReads) -> Stats:
    """The ``Stats`` of a snapshot from what the driver read in it (every store's one assembly)."""
    by_status: dict[str, int] = {str(status): 0 for status in STATUSES}
    dead: Counter[str] = Counter()
    for status, reason, jobs in reads.counts:
        by_status[status] = by_status.get(status, 0) + int(jobs)
        if status == DEAD:
            dead[reason or ""] += int(jobs)  # a dead job without a reason (set by hand) counts under ""
    attempts: Counter[int] = Counter()
    for tries, jobs in reads.attempts:
        attempts[int(tries)] += int(jobs)
    owners: dict[str, tuple[int, int]] = {}
    for owner, jobs, first in reads.leases:
        held, earliest = owners.get(owner, (0, int(first)))
        owners[owner] = (held + int(jobs), min(earliest, int(first)))
    return Stats(
        now_ms=now_ms,
        by_status=by_status,
        dead_by_reason={reason: n for reason, n in dead.items() if n},
        oldest_ready_age_ms=None if reads.oldest_ready is None else now_ms - int(reads.oldest_ready),
        expired_leases=int(reads.expired),
        leases=[OwnerLeases(owner, held, first) for owner, (held, first) in owners.items()],
        attempts={tries: n for tries, n in sorted(attempts.items()) if n},
    )


def stats_of_jobs(jobs: Iterable[Job], now_ms: int) -> Stats:
    """Every figure of ``Stats`` as the rows define it, from a full listing (the reference for every store; the
    owners are listed in code-point order, as the drivers' ``ORDER BY owner`` in a binary collation)."""
    rows = list(jobs)
    ready = [job.available_at for job in rows if job.status == PENDING and job.available_at <= now_ms]
    live = [job for job in rows if job.status == LEASED]
    owners = sorted({job.owner for job in live if job.owner is not None})
    leases = [
        OwnerLeases(
            owner, sum(job.owner == owner for job in live), min(j.lease_until or 0 for j in live if j.owner == owner)
        )
        for owner in owners
    ]
    attempts = Counter(job.attempts for job in rows if job.status in (PENDING, LEASED))
    return Stats(
        now_ms=now_ms,
        by_status={status: sum(job.status == status for job in rows) for status in STATUSES},
        dead_by_reason=dict(Counter(job.reason or "" for job in rows if job.status == DEAD)),
        oldest_ready_age_ms=now_ms - min(ready) if ready else None,
        expired_leases=sum(job.lease_until is not None and job.lease_until <= now_ms for job in live),
        leases=leases,
        attempts=dict(sorted(attempts.items())),
    )
