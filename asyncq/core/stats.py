"""What an operator reads about a queue: the value types every store returns for stats (no I/O here)."""

from __future__ import annotations

from dataclasses import dataclass, field


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
