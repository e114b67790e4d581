"""What an operator reads about a queue: counts by status and reason, age of the oldest ready job,
leases in flight by owner, attempts. One read transaction, all statements by name here.

No figure scans the table, whatever the depth (``benchmarks/stats_depth.py``; plans in docs/benchmarks.md). Counts
by status, dead jobs by reason and the live jobs' attempts are sums over the few cells of ``asyncq_counts``, kept
by triggers in every transaction that moves a job (``schema.JOB_COUNTS``). The oldest ready job is the first entry
of the ``asyncq_jobs_ready_at`` index. Expired leases and leases by owner read the ``leased`` index: in flight only.
"""

from __future__ import annotations

import logging
import sqlite3
from collections import Counter

from asyncq.core.stats import Lease, Stats
from asyncq.store.sqlite.schema import Layout

log = logging.getLogger("asyncq.store.sqlite.stats")

LIVE = ("pending", "leased")
STATUSES = ("pending", "leased", "done", "dead")

COUNTED_CELLS = "SELECT status, attempts, reason, jobs FROM {counts} WHERE jobs <> 0"
# ``available_at + 0`` is the indexed expression (``asyncq_jobs_ready_at``): the minimum is one seek.
OLDEST_READY = "SELECT min(available_at + 0) FROM {jobs} WHERE status = 'pending' AND available_at + 0 <= :now"
LEASES_BY_OWNER = (
    "SELECT owner, count(*), min(lease_until) FROM {jobs} WHERE status = 'leased' GROUP BY owner ORDER BY owner"
)
EXPIRED_LEASES = "SELECT count(*) FROM {jobs} WHERE status = 'leased' AND lease_until <= :now"
NAMES = {
    "COUNTED_CELLS": COUNTED_CELLS,
    "OLDEST_READY": OLDEST_READY,
    "LEASES_BY_OWNER": LEASES_BY_OWNER,
    "EXPIRED_LEASES": EXPIRED_LEASES,
}


def read_stats(con: sqlite3.Connection, layout: Layout, now_ms: int) -> Stats:
    """Read every figure in one transaction, so they agree with each other."""
    if layout.counts is None:
        raise ValueError(f"the {layout.jobs} table keeps no counts: stats are the product schema's")
    params = {"now": now_ms}

    def rows(name: str) -> list[tuple[object, ...]]:
        return con.execute(NAMES[name].format(jobs=layout.jobs, counts=layout.counts), params).fetchall()

    con.execute("BEGIN")
    try:
        cells = rows("COUNTED_CELLS")
        oldest = rows("OLDEST_READY")[0][0]
        expired = int(str(rows("EXPIRED_LEASES")[0][0]))
        leases = [Lease(str(o), int(str(n)), int(str(e))) for o, n, e in rows("LEASES_BY_OWNER")]
    finally:
        con.execute("COMMIT")
    by_status, dead, attempts = sum_cells(cells)
    return Stats(
        now_ms=now_ms,
        by_status=by_status,
        dead_by_reason=dead,
        oldest_ready_age_ms=None if oldest is None else now_ms - int(str(oldest)),
        expired_leases=expired,
        leases=leases,
        attempts=attempts,
    )


def sum_cells(cells: list[tuple[object, ...]]) -> tuple[dict[str, int], dict[str, int], dict[int, int]]:
    """Counts by status, dead jobs by reason and live jobs by attempts, from ``(status, attempts, reason, jobs)``
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
        elif status in LIVE:
            attempts[int(str(tries))] += count
    return (
        {status: by_status[status] for status in STATUSES},
        {reason: n for reason, n in dead.items() if n},
        {tries: n for tries, n in sorted(attempts.items()) if n},
    )
