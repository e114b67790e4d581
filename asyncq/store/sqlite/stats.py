"""What an operator reads about a queue: counts by status and reason, age of the oldest ready job,
leases in flight by owner, attempts. One read transaction, all statements by name here.

No figure scans the table, whatever the depth (``benchmarks/stats_depth.py``; plans in docs/benchmarks.md). Jobs not
leased are counted by the cells of ``asyncq_counts``, which triggers keep in every transaction that moves a job
(``schema.JOB_COUNTS``): pending, done and dead by status, dead by reason, pending by attempts. Leased jobs are read
from the ``leased`` index, in one pass: in flight only. The oldest ready job takes two seeks per queue with pending
jobs (``OLDEST_READY``).
"""

from __future__ import annotations

import logging
import sqlite3
from typing import Any

from asyncq.core.lifecycle import LEASED as LEASED_STATUS
from asyncq.core.lifecycle import PENDING
from asyncq.core.stats import Stats, StatsReads, assemble_stats
from asyncq.store.sqlite.schema import QUEUES_OF, Layout

log = logging.getLogger("asyncq.store.sqlite.stats")

COUNTED_CELLS = "SELECT status, attempts, reason, jobs FROM {counts} WHERE jobs <> 0"
LEASED = (
    "SELECT owner, attempts, count(*), min(lease_until), sum(lease_until <= :now) FROM {jobs}"
    " WHERE status = 'leased' GROUP BY owner, attempts ORDER BY owner, attempts"
)
# The least of each queue's oldest pending job, if it is ready. The queues with pending jobs, by a skip scan of
# ``asyncq_jobs_ranked`` (``schema.QUEUES_OF``); each queue's oldest is two seeks (``schema.PENDING_BY_TIME``: the
# default priority's range of the ranked index, the others' first entry in ``asyncq_jobs_prioritised``).
OLDEST_READY = f"""
SELECT min(oldest) FROM (
  SELECT min(coalesce(zero, other), coalesce(other, zero)) AS oldest FROM (
    SELECT (SELECT min(available_at) FROM {{jobs}} WHERE status = 'pending' AND queue = q.name AND priority = 0)
        AS zero,
      (SELECT min(available_at) FROM {{jobs}} WHERE status = 'pending' AND queue = q.name AND priority <> 0)
        AS other
    FROM ({QUEUES_OF.format(jobs="{jobs}", where="status = 'pending'")}) q)
) WHERE oldest <= :now
"""
NAMES = {"COUNTED_CELLS": COUNTED_CELLS, "LEASED": LEASED, "OLDEST_READY": OLDEST_READY}

Cells = list[tuple[Any, ...]]


def read_stats(con: sqlite3.Connection, layout: Layout, now_ms: int) -> Stats:
    """Read every figure in one transaction, so they agree with each other (assembled by ``core.stats``)."""
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
    _warn_negative(cells)
    reads = StatsReads(
        counts=[(status, reason, jobs) for status, _tries, reason, jobs in cells]
        + [(LEASED_STATUS, None, jobs) for _owner, _tries, jobs, _first, _gone in leased],
        attempts=[(tries, jobs) for status, tries, _reason, jobs in cells if status == PENDING]
        + [(tries, jobs) for _owner, tries, jobs, _first, _gone in leased],
        leases=[(owner, jobs, first) for owner, _tries, jobs, first, _gone in leased],
        expired=sum(gone or 0 for *_group, gone in leased),
        oldest_ready=oldest,
    )
    return assemble_stats(now_ms, reads)


def _warn_negative(cells: Cells) -> None:
    """A negative cell of ``(status, attempts, reason, jobs)`` means rows moved without the triggers (they were
    dropped, or a ``REPLACE`` ran with ``recursive_triggers`` off): it is logged, and counted as it stands."""
    for status, tries, reason, jobs in cells:
        if jobs < 0:
            cell = (status, tries, reason)
            log.warning("asyncq_counts holds %d jobs in %s: the kept counts disagree with the rows", jobs, cell)
