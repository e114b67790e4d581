"""What an operator reads about a queue: counts by status and reason, age of the oldest ready job,
leases in flight by owner, attempts. One read transaction, all statements by name here.

No figure scans the table, whatever the depth (``benchmarks/stats_depth.py``; plans in docs/benchmarks.md). Jobs not
leased are counted by the cells of ``asyncq_counts``, which triggers keep in every transaction that moves a job
(``schema.JOB_COUNTS``): pending, done and dead by status, dead by reason, pending by attempts. Leased jobs are read
from the ``leased`` index, in one pass: in flight only. The oldest ready job is the first entry of the
``asyncq_jobs_ready_at`` index.
"""

from __future__ import annotations

import logging
import sqlite3
from collections import Counter

from asyncq.core.lifecycle import STATUSES
from asyncq.core.stats import OwnerLeases, Stats
from asyncq.store.sqlite.schema import Layout

log = logging.getLogger("asyncq.store.sqlite.stats")

COUNTED_CELLS = "SELECT status, attempts, reason, jobs FROM {counts} WHERE jobs <> 0"
LEASED = (
    "SELECT owner, attempts, count(*), min(lease_until), sum(lease_until <= :now) FROM {jobs}"
    " WHERE status = 'leased' GROUP BY owner, attempts ORDER BY owner, attempts"
)
# ``available_at + 0`` is the indexed expression (``asyncq_jobs_ready_at``): the minimum is one seek.
OLDEST_READY = "SELECT min(available_at + 0) FROM {jobs} WHERE status = 'pending' AND available_at + 0 <= :now"
NAMES = {"COUNTED_CELLS": COUNTED_CELLS, "LEASED": LEASED, "OLDEST_READY": OLDEST_READY}

Cells = list[tuple[object, ...]]


def read_stats(con: sqlite3.Connection, layout: Layout, now_ms: int) -> Stats:
    """Read every figure in one transaction, so they agree with each other."""
    if layout.counts is None:
        raise ValueError(f"the {layout.jobs} table keeps no counts: stats are the product schema's")
    params = {"now": now_ms}

    def rows(name: str) -> Cells:
        return con.execute(NAMES[name].format(jobs=layout.jobs, counts=layout.counts), params).fetchall()

    con.execute("BEGIN")
    try:
        cells, leased, [(oldest,)] = rows("COUNTED_CELLS"), rows("LEASED"), rows("OLDEST_READY")
    finally:
        con.execute("COMMIT")
    by_status, dead, attempts = sum_cells(cells)
    leases, expired = _leases(leased, by_status, attempts)
    return Stats(
        now_ms=now_ms,
        by_status=by_status,
        dead_by_reason=dead,
        oldest_ready_age_ms=None if oldest is None else now_ms - int(str(oldest)),
        expired_leases=expired,
        leases=leases,
        attempts={tries: n for tries, n in sorted(attempts.items()) if n},
    )


def _leases(leased: Cells, by_status: dict[str, int], attempts: Counter[int]) -> tuple[list[OwnerLeases], int]:
    """Leases by owner and how many have expired, from ``LEASED``'s ``(owner, attempts, jobs, first expiry,
    expired)`` groups; adds the leased jobs to ``by_status`` and ``attempts``."""
    owners: dict[str, tuple[int, int]] = {}
    expired = 0
    for owner, tries, jobs, first, gone in leased:
        count, name = int(str(jobs)), str(owner)
        by_status["leased"] += count
        attempts[int(str(tries))] += count
        expired += int(str(gone or 0))
        held, earliest = owners.get(name, (0, int(str(first))))
        owners[name] = (held + count, min(earliest, int(str(first))))
    return [OwnerLeases(owner, held, first) for owner, (held, first) in owners.items()], expired


def sum_cells(cells: Cells) -> tuple[dict[str, int], dict[str, int], Counter[int]]:
    """Counts by status, dead jobs by reason and pending jobs by attempts, from ``(status, attempts, reason, jobs)``
    cells. A negative cell means rows moved without the triggers (they were dropped, or a ``REPLACE`` ran with
    ``recursive_triggers`` off): it is logged, and counted as it stands."""
    by_status: Counter[str] = Counter()
    dead: Counter[str] = Counter()
    attempts: Counter[int] = Counter()
    for status, tries, reason, jobs in cells:
        count = int(str(jobs))
        if count < 0:
            cell = (status, tries, reason)
            log.warning("asyncq_counts holds %d jobs in %s: the kept counts disagree with the rows", count, cell)
        by_status[str(status)] += count
        if status == "dead":
            dead[str(reason)] += count
        elif status == "pending":
            attempts[int(str(tries))] += count
    return {status: by_status[status] for status in STATUSES}, {reason: n for reason, n in dead.items() if n}, attempts
