"""Worker processes sharing one queue file: each holds no more leases than its bound, and each gets jobs.

Real child processes (``tests/pool_children.py``) on one file. What is asserted is structure, not speed: the
leases each process holds in the file (sampled while they work) never exceed its ``concurrency + prefetch``,
every job is applied exactly once, and every process finished some of them: a process waiting for the write
lock takes it in turn (``AsyncFile._begin_in_turn``) instead of sleeping in SQLite's busy handler while a
sibling commits again and again. How fair the shares are is measured in ``benchmarks/processes.py``.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from asyncq.worker.settings import COMMIT_ROUNDS

try:
    from test_pool_processes import Workers, count, enqueue, query, workers
except ImportError:  # tests/ imported as a package
    from tests.test_pool_processes import Workers, count, enqueue, query, workers

__all__ = ["workers"]  # the fixture, imported for this module's tests

pytestmark = pytest.mark.timeout(90)

JOBS = 2_000
CONCURRENCY = 4
# Pool's defaults at 4 slots: a batch of eight rounds, a prefetch of a batch and a round.
BOUND = CONCURRENCY + COMMIT_ROUNDS * CONCURRENCY + CONCURRENCY


def leases_by_owner(db: Path) -> dict[str, int]:
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=10)
    try:
        rows = con.execute("SELECT owner, count(*) FROM asyncq_jobs WHERE status = 'leased' GROUP BY owner")
        return {owner: n for owner, n in rows}
    finally:
        con.close()


def test_processes_on_one_file_stay_within_their_leases_and_each_finishes_jobs(workers: Workers) -> None:
    enqueue(workers.db, JOBS)
    owners = ["w1", "w2", "w3"]
    procs = [workers.start(owner, concurrency=CONCURRENCY, handler_seconds=0.01, lease_ms=10_000) for owner in owners]
    most: dict[str, int] = dict.fromkeys(owners, 0)

    def sample_until_done() -> bool:
        for owner, held in leases_by_owner(workers.db).items():
            most[owner] = max(most[owner], held)
        return count(workers.db, "SELECT count(*) FROM asyncq_jobs WHERE status = 'done'") == JOBS

    workers.wait_until(sample_until_done, 75, f"{JOBS} jobs done")
    finished = {}
    for owner, proc in zip(owners, procs, strict=True):
        code, counters = workers.stop(proc, timeout=10)
        assert code == 0, workers.stderr()
        assert counters["stale_finishes"] == counters["leases_lost"] == 0
        finished[owner] = counters["finished"].get("done", 0)

    assert all(held <= BOUND for held in most.values()), (most, BOUND)
    assert max(most.values()) > 0  # the sampling saw leases at all
    assert sum(finished.values()) == JOBS
    assert all(done > 0 for done in finished.values()), finished
    applied = query(workers.effects, "SELECT owner, count(*), max(count) FROM applied GROUP BY owner")
    assert {owner: n for owner, n, _ in applied} == finished  # each process applied exactly what it finished
    assert all(most_applied == 1 for _, _, most_applied in applied)  # no job applied twice
