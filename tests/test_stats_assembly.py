"""``core.stats``: the one assembly of ``Stats`` from a driver's reads, against the definition from the rows.

The conformance suite compares each store's ``stats()`` with ``stats_of_jobs`` over a full listing at every
step; here the assembly's own rules are pinned: repeated keys summed, an owner's groups merged, empty cells left
out, every status present."""

from __future__ import annotations

from asyncq.core.jobs import Job
from asyncq.core.stats import OwnerLeases, Stats, StatsReads, assemble_stats, stats_of_jobs

NOW = 10_000


def job(seq: int, status: str, *, attempts: int = 0, owner: str | None = None, **columns: object) -> Job:
    fields: dict[str, object] = {
        "seq": seq,
        "id": f"job-{seq}",
        "queue": "default",
        "body": {},
        "status": status,
        "attempts": attempts,
        "max_attempts": 3,
        "token": attempts,
        "available_at": 0,
        "deadline": NOW * 10,
        "owner": owner,
        "lease_until": None if owner is None else NOW + seq,
        "reason": None,
    }
    return Job(**(fields | columns))  # type: ignore[arg-type]


def test_the_assembly_sums_repeated_keys_merges_each_owners_groups_and_drops_empty_cells() -> None:
    reads = StatsReads(
        counts=[
            ("pending", None, 2),
            ("pending", "retry", 1),
            ("leased", None, 2),
            ("leased", None, 1),
            ("dead", "exhausted", 1),
            ("dead", "deadline", 0),
            ("done", None, 0),
        ],
        attempts=[(0, 2), (1, 1), (1, 2), (2, 0)],
        leases=[("w1", 1, 300), ("w1", 1, 200), ("w2", 1, 100)],
        expired=1,
        oldest_ready=4_000,
    )
    assert assemble_stats(NOW, reads) == Stats(
        now_ms=NOW,
        by_status={"pending": 3, "leased": 3, "done": 0, "dead": 1, "waiting": 0},
        dead_by_reason={"exhausted": 1},
        oldest_ready_age_ms=6_000,
        expired_leases=1,
        leases=[OwnerLeases("w1", 2, 200), OwnerLeases("w2", 1, 100)],
        attempts={0: 2, 1: 3},
    )


def test_nothing_read_is_an_empty_queue_with_every_status() -> None:
    empty = assemble_stats(NOW, StatsReads([], [], [], 0, None))
    assert empty == stats_of_jobs([], NOW)
    assert empty.by_status == {"pending": 0, "leased": 0, "done": 0, "dead": 0, "waiting": 0} and empty.total == 0


def test_the_reads_grouped_from_a_listing_assemble_to_its_definition() -> None:
    jobs = [
        job(1, "pending"),
        job(2, "pending", attempts=1, reason="retry", available_at=NOW + 1),  # not ready yet
        job(3, "leased", attempts=1, owner="w2"),
        job(4, "leased", attempts=2, owner="w1", lease_until=NOW - 1),  # expired
        job(5, "done", attempts=1),
        job(6, "dead", attempts=3, reason="exhausted"),
    ]
    live = [j for j in jobs if j.status == "leased"]
    reads = StatsReads(
        counts=[(j.status, j.reason, 1) for j in jobs],
        attempts=[(j.attempts, 1) for j in jobs if j.status in ("pending", "leased")],
        leases=[(j.owner or "", 1, j.lease_until or 0) for j in sorted(live, key=lambda j: j.owner or "")],
        expired=sum((j.lease_until or 0) <= NOW for j in live),
        oldest_ready=min(j.available_at for j in jobs if j.status == "pending" and j.available_at <= NOW),
    )
    assert assemble_stats(NOW, reads) == stats_of_jobs(jobs, NOW)
