"""The retention step on SQLite (``docs/flow-control.md``, "Retention"): the groups of ended jobs a run looks at, and
one bounded step removing a group's jobs past its window. Both seek ``asyncq_jobs_retained`` (``(queue, task,
status, reason, available_at)`` over the done and dead rows; its WHERE repeated word for word), never the table:
the groups by skipping through it (one seek per queue and per task found), a step one seek per cell of its state
(``core.retention.STATE_CELLS``), walking the expired range oldest first and stopping at its batch. The removal is
the one ``prune`` uses (``admin.remove_jobs``).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from typing import Any

from asyncq.core.retention import STATE_CELLS
from asyncq.store.sqlite.admin import remove_jobs
from asyncq.store.sqlite.connection import write_transaction
from asyncq.store.sqlite.graph_schema import NEEDED_BY_GRAPH
from asyncq.store.sqlite.schema import ENDED_AT, PRODUCT

_JOBS = PRODUCT.jobs
_ENDED = "status IN ('done', 'dead')"

# One group's jobs of one cell (status, reason) that ended before the cutoff, oldest first (the task ``IS`` a value
# or NULL: the jobs without one); the end (``ENDED_AT``) is checked on the rows found. A done job whose result is
# still kept stays (a caller may be waiting for it), and
# so does a job a graph still needs (``graph_schema.NEEDED_BY_GRAPH``).
EXPIRED_SEQS = f"""
SELECT seq FROM {_JOBS} j WHERE {_ENDED} AND queue = :queue AND task IS :task AND status = :status
  AND reason IS :reason AND available_at < :cutoff AND {ENDED_AT} < :cutoff
  AND NOT EXISTS (SELECT 1 FROM {PRODUCT.results} r WHERE r.job_seq = j.seq AND r.expires_at > :now)
  AND NOT {NEEDED_BY_GRAPH}
ORDER BY available_at LIMIT :limit
"""
# The queues that have ended jobs, by skipping through the index: each step seeks the next queue's first entry.
QUEUES_ENDED = f"""
WITH RECURSIVE found(queue) AS (
  SELECT (SELECT queue FROM {_JOBS} WHERE {_ENDED} ORDER BY queue LIMIT 1)
  UNION ALL
  SELECT (SELECT queue FROM {_JOBS} WHERE {_ENDED} AND queue > found.queue ORDER BY queue LIMIT 1)
  FROM found WHERE found.queue IS NOT NULL
)
SELECT queue FROM found WHERE queue IS NOT NULL
"""
# The tasks of one queue's ended jobs, the same way.
TASKS_ENDED = f"""
WITH RECURSIVE found(task) AS (
  SELECT (SELECT task FROM {_JOBS} WHERE {_ENDED} AND queue = :queue AND task IS NOT NULL ORDER BY task LIMIT 1)
  UNION ALL
  SELECT (SELECT task FROM {_JOBS} WHERE {_ENDED} AND queue = :queue AND task > found.task ORDER BY task LIMIT 1)
  FROM found WHERE found.task IS NOT NULL
)
SELECT task FROM found WHERE task IS NOT NULL
"""
# Whether one queue has ended jobs without a task.
UNTASKED_ENDED = f"SELECT EXISTS (SELECT 1 FROM {_JOBS} WHERE {_ENDED} AND queue = :queue AND task IS NULL)"


def ended_groups(con: sqlite3.Connection, queues: Sequence[str] | None) -> list[tuple[str, str | None]]:
    """The ``(queue, task)`` groups of ended jobs (``None``: the jobs without a task) of ``queues``, or of every
    queue (``None``), by queue then task, those without one first."""
    names = [queue for (queue,) in con.execute(QUEUES_ENDED)] if queues is None else queues
    groups: list[tuple[str, str | None]] = []
    for queue in names:
        if con.execute(UNTASKED_ENDED, {"queue": queue}).fetchone()[0]:
            groups.append((queue, None))
        groups += [(queue, task) for (task,) in con.execute(TASKS_ENDED, {"queue": queue})]
    return groups


def remove_expired(
    con: sqlite3.Connection, queue: str, task: str | None, state: str, cutoff_ms: int, now_ms: int, limit: int
) -> int:
    """One retention step, one write transaction: remove up to ``limit`` of the jobs of ``queue`` and ``task`` in
    ``state`` that ended before ``cutoff_ms`` (``EXPIRED_SEQS``, cell by cell of the state); how many."""
    params: dict[str, Any] = {"queue": queue, "task": task, "cutoff": cutoff_ms, "now": now_ms}
    seqs: list[int] = []
    with write_transaction(con):
        for cell in STATE_CELLS[state]:
            cell_params = params | cell._asdict() | {"limit": limit - len(seqs)}
            seqs += [seq for (seq,) in con.execute(EXPIRED_SEQS, cell_params)]
            if len(seqs) >= limit:
                break
        return remove_jobs(con, seqs)
