"""What an operator reads about a queue: counts by status and reason, age of the oldest ready job,
leases in flight by owner, attempts. One read transaction, all statements by name here.

The live figures (ready age, leases, attempts of pending/leased jobs) read the partial lifecycle indexes. The
counts of ``done`` and ``dead`` jobs scan the table: history has no index on purpose, so that finishing a job
writes no index entry; ``asyncq prune`` bounds it. Samplers of very large files should sample slowly."""

from __future__ import annotations

import sqlite3

from asyncq.core.stats import Lease, Stats
from asyncq.store.sqlite.schema import Layout

COUNT_BY_STATUS = "SELECT status, count(*) FROM {jobs} GROUP BY status"
DEAD_BY_REASON = "SELECT reason, count(*) FROM {jobs} WHERE status = 'dead' GROUP BY reason"
OLDEST_READY = "SELECT min(available_at) FROM {jobs} WHERE status = 'pending' AND available_at <= :now"
LEASES_BY_OWNER = (
    "SELECT owner, count(*), min(lease_until) FROM {jobs} WHERE status = 'leased' GROUP BY owner ORDER BY owner"
)
ATTEMPTS_HISTOGRAM = (
    "SELECT attempts, count(*) FROM {jobs} WHERE status IN ('pending', 'leased') GROUP BY attempts ORDER BY attempts"
)
EXPIRED_LEASES = "SELECT count(*) FROM {jobs} WHERE status = 'leased' AND lease_until <= :now"


def read_stats(con: sqlite3.Connection, layout: Layout, now_ms: int) -> Stats:
    """Read every figure in one transaction, so they agree with each other."""
    params = {"now": now_ms}

    def rows(statement: str) -> list[tuple[object, ...]]:
        return con.execute(statement.format(jobs=layout.jobs), params).fetchall()

    con.execute("BEGIN")
    try:
        by_status = {str(s): int(str(n)) for s, n in rows(COUNT_BY_STATUS)}
        dead = {str(r): int(str(n)) for r, n in rows(DEAD_BY_REASON)}
        oldest = rows(OLDEST_READY)[0][0]
        expired = int(str(rows(EXPIRED_LEASES)[0][0]))
        leases = [Lease(str(o), int(str(n)), int(str(e))) for o, n, e in rows(LEASES_BY_OWNER)]
        attempts = {int(str(a)): int(str(n)) for a, n in rows(ATTEMPTS_HISTOGRAM)}
    finally:
        con.execute("COMMIT")
    return Stats(
        now_ms=now_ms,
        by_status={status: by_status.get(status, 0) for status in ("pending", "leased", "done", "dead")},
        dead_by_reason=dead,
        oldest_ready_age_ms=None if oldest is None else now_ms - int(str(oldest)),
        expired_leases=expired,
        leases=leases,
        attempts=attempts,
    )
