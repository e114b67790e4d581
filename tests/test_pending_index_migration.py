"""SQLite schema version 16 (``schema.PENDING_BY_TIME``): the pending jobs by ready time are indexed only beside a
priority other than 0, and the all-queue ready-time index goes. A file of the version before migrates with its
jobs, and every read that walked the dropped indexes gives the same answers: the claim order with ``max_wait``'s late
jobs first, the oldest ready job's age, and the console's pending figures."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from asyncq import JobSpec
from asyncq.queue import Queue

T0 = 1_800_000_000_000


def _back_to_version_15(path: Path) -> None:
    from asyncq.store.sqlite.migrations import MIGRATIONS, SCHEMA_VERSION
    from asyncq.store.sqlite.schema import OFFERS, PENDING_BY_TIME

    assert MIGRATIONS[-2:] == (PENDING_BY_TIME, OFFERS)  # the hand-undo below undoes these versions only
    con = sqlite3.connect(path, isolation_level=None)
    try:
        con.execute("DROP TABLE asyncq_offers")
        con.execute("DROP TABLE asyncq_offered")
        con.execute("DROP INDEX asyncq_jobs_prioritised")
        con.execute("CREATE INDEX asyncq_jobs_waiting ON asyncq_jobs(queue, available_at) WHERE status = 'pending'")
        con.execute("CREATE INDEX asyncq_jobs_ready_at ON asyncq_jobs(available_at + 0) WHERE status = 'pending'")
        con.execute(f"PRAGMA user_version = {SCHEMA_VERSION - 2}")
    finally:
        con.close()


def _indexes(path: Path) -> set[str]:
    con = sqlite3.connect(path)
    try:
        return {name for (name,) in con.execute("SELECT name FROM sqlite_master WHERE type = 'index'")}
    finally:
        con.close()


async def test_a_version_15_file_migrates_and_claims_late_jobs_first_then_by_priority(tmp_path: Path) -> None:
    path = tmp_path / "queue.db"
    now = [T0]
    async with await Queue.open(path, clock=lambda: now[0]) as queue:
        # Ready at T0 (priority 0 and 5), at T0 + 50 s (priority 0 and -3), a delayed one, and another queue's.
        await queue.enqueue_many([JobSpec("old-zero", {}, "work"), JobSpec("old-high", {}, "work", priority=5)])
        now[0] = T0 + 50_000
        await queue.enqueue_many(
            [
                JobSpec("new-zero", {}, "work"),
                JobSpec("new-low", {}, "work", priority=-3),
                JobSpec("later", {}, "work", delay=3600),
                JobSpec("elsewhere", {}, "other", priority=2),
            ]
        )
    _back_to_version_15(path)
    now[0] = T0 + 100_000
    async with await Queue.open(path, clock=lambda: now[0]) as queue:
        assert "asyncq_jobs_prioritised" in _indexes(path)
        assert not {"asyncq_jobs_waiting", "asyncq_jobs_ready_at"} & _indexes(path)
        stats = await queue.stats()
        assert stats.oldest_ready_age_ms == 100_000  # old-zero and old-high, ready since T0
        # max_wait 60 s: the two jobs ready since T0 are late (oldest first, then seq: whatever their priority),
        # then the rest by priority; the delayed job is not ready.
        await queue.set_max_wait("work", 60, note="bound the wait")
        claimed = [ticket.id for ticket in await queue.claim("w", queue="work", limit=10)]
        assert claimed == ["old-zero", "old-high", "new-zero", "new-low"]
        assert (await queue.stats()).oldest_ready_age_ms == 50_000  # elsewhere, ready since T0 + 50 s
        [other] = await queue.claim("w", queue="other")
        assert other.id == "elsewhere"
        assert (await queue.stats()).oldest_ready_age_ms is None  # only the delayed job is pending


async def test_without_max_wait_the_order_is_priority_then_ready_time_on_a_new_file(tmp_path: Path) -> None:
    now = [T0]
    async with await Queue.open(tmp_path / "queue.db", clock=lambda: now[0]) as queue:
        await queue.enqueue_many([JobSpec("a", {}), JobSpec("b", {}, priority=-1)])
        now[0] += 1
        await queue.enqueue_many([JobSpec("c", {}, priority=1), JobSpec("d", {})])
        now[0] += 1
        assert (await queue.stats()).oldest_ready_age_ms == 2
        assert [ticket.id for ticket in await queue.claim("w", limit=10)] == ["c", "a", "d", "b"]
