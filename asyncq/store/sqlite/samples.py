"""What the console samples on SQLite (``core.samples``): every queue's figures read in one snapshot from the
partial indexes (a few seeks and bounded counts per queue: no table scan at any depth), written as one sample in
a short write transaction; the samples and the workers seen read back; and the dead jobs grouped by reason and
their newest error's type.

The queues are found by a skip scan of each index that leads with the queue (the ranked pending jobs, the leased
ones, the ended ones): one seek per queue, not a walk of the rows.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from typing import Any

from asyncq.core.samples import (
    DEPTH_CAP,
    FAILURES_CAP,
    Figures,
    LeaseSeen,
    QueueFigures,
    Sample,
    WorkerLook,
    WorkerSeen,
    is_due,
)
from asyncq.core.search import DeadGroup
from asyncq.store.sqlite.admin import snapshot
from asyncq.store.sqlite.connection import write_transaction
from asyncq.store.sqlite.retention import TASKS_ENDED
from asyncq.store.sqlite.schema import PRODUCT, QUEUES_OF

_JOBS, _ERRORS = PRODUCT.jobs, PRODUCT.errors

_INDEXED = ("status = 'pending'", "status = 'leased'", "status IN ('done', 'dead')")
QUEUES = (*(QUEUES_OF.format(jobs=_JOBS, where=where) for where in _INDEXED), "SELECT queue FROM asyncq_queues")
# A queue's pending jobs, the soonest due first, at most :cap: how many, how many of them are ready, and the oldest
# ready one. Two ranges in ready-time order, each stopping at :cap (schema.PENDING_BY_TIME: the default priority's
# in asyncq_jobs_ranked, the others' in asyncq_jobs_prioritised), merged.
PENDING = f"""
SELECT count(*), ifnull(sum(available_at <= :now), 0), min(CASE WHEN available_at <= :now THEN available_at END)
FROM (SELECT available_at FROM (
        SELECT available_at FROM {_JOBS} WHERE status = 'pending' AND queue = :queue AND priority = 0
        ORDER BY available_at LIMIT :cap)
      UNION ALL
      SELECT available_at FROM (
        SELECT available_at FROM {_JOBS} WHERE status = 'pending' AND queue = :queue AND priority <> 0
        ORDER BY available_at LIMIT :cap)
      ORDER BY available_at LIMIT :cap)
"""
LEASED = f"SELECT count(*) FROM {_JOBS} WHERE status = 'leased' AND queue = :queue"
# Jobs that ended since the previous sample, by the ended jobs' index ``(queue, task, status, reason, available_at)``
# (finish and cancel stamp ``available_at``): one seek of each cell per task of the queue (the tasks found by skipping
# through the same index, ``retention.TASKS_ENDED``), and of the jobs without a task. A count over the queue alone
# would read every ended job of it: the task sits between the queue and the status in that index.
_ENDED = f"""(SELECT count(*) FROM {_JOBS} WHERE status IN ('done', 'dead') AND queue = :queue AND task {{task}}
  AND {{cell}} AND available_at > :since AND available_at <= :now)"""
_DONE = "status = 'done' AND reason IS NULL"
_DEAD = "status = 'dead' AND reason IN ('deadline', 'exhausted', 'permanent', 'cancelled')"
ENDED_UNTASKED = "SELECT " + ", ".join(_ENDED.format(task="IS NULL", cell=cell) for cell in (_DONE, _DEAD))
ENDED_TASKED = (
    "SELECT ifnull(sum(done), 0), ifnull(sum(dead), 0) FROM (SELECT "
    + ", ".join(
        _ENDED.format(task="= f.task", cell=cell) + f" AS {name}" for name, cell in (("done", _DONE), ("dead", _DEAD))
    )
    + f" FROM ({TASKS_ENDED}) f)"
)
FAILED = f"""
SELECT j.queue, count(*) FROM (SELECT job_seq FROM {_ERRORS} WHERE seq > :errors_seq ORDER BY seq LIMIT :cap) e
JOIN {_JOBS} j ON j.seq = e.job_seq GROUP BY j.queue
"""
LAST_ERROR = f"SELECT ifnull(max(seq), 0) FROM {_ERRORS}"
LEASES = f"SELECT owner, id, token, lease_until FROM {_JOBS} INDEXED BY {_JOBS}_leased WHERE status = 'leased'"
NEWEST_SAMPLE = "SELECT at_ms, errors_seq FROM asyncq_samples ORDER BY at_ms DESC LIMIT 1"
_FIGURES = "queue, pending, ready, leased, oldest_ready_at, done, dead, failed, capped"
INSERT_SAMPLE = (
    f"INSERT OR REPLACE INTO asyncq_samples (at_ms, {_FIGURES}, errors_seq) VALUES ({', '.join(['?'] * 11)})"
)
SAMPLES_SINCE = f"SELECT at_ms, {_FIGURES} FROM asyncq_samples WHERE at_ms >= :since ORDER BY at_ms, queue"
FORGET_SAMPLES = "DELETE FROM asyncq_samples WHERE at_ms < :cutoff"
SEE_WORKER = """
INSERT INTO asyncq_workers_seen (owner, first_seen_ms, last_seen_ms, leases, renewals, last_renewal_ms)
VALUES (:owner, :now, :now, :leases, :renewals, CASE WHEN :renewals > 0 THEN :now END)
ON CONFLICT (owner) DO UPDATE SET last_seen_ms = :now, leases = :leases, renewals = renewals + :renewals,
  last_renewal_ms = CASE WHEN :renewals > 0 THEN :now ELSE last_renewal_ms END
"""
FORGET_WORKERS = "DELETE FROM asyncq_workers_seen WHERE last_seen_ms < :cutoff"
WORKERS = (
    "SELECT owner, first_seen_ms, last_seen_ms, leases, renewals, last_renewal_ms FROM asyncq_workers_seen"
    " ORDER BY last_seen_ms DESC, owner LIMIT 1000"
)
_NEWEST_DEAD = f"SELECT seq FROM {_JOBS} INDEXED BY {_JOBS}_dead WHERE status = 'dead' ORDER BY seq DESC LIMIT :scan"
# The newest dead jobs grouped by queue, reason and their newest error's type (a bare ``id`` beside ``max(seq)``
# is the newest job's: SQLite takes bare columns from the row of the max).
DEAD_GROUPS = f"""
SELECT j.queue, j.reason, (SELECT e.type FROM {_ERRORS} e WHERE e.job_seq = j.seq ORDER BY e.seq DESC LIMIT 1) AS type,
  count(*) AS n, max(j.seq), j.id
FROM ({_NEWEST_DEAD}) d CROSS JOIN {_JOBS} j ON j.seq = d.seq
WHERE :queue IS NULL OR j.queue = :queue
GROUP BY 1, 2, 3 ORDER BY n DESC, 1, 2, 3
"""
DEAD_LOOKED_AT = f"SELECT count(*) FROM ({_NEWEST_DEAD})"


def read_figures(con: sqlite3.Connection, now_ms: int) -> Figures:
    """Every queue's figures now and since the newest sample, in one read snapshot."""
    with snapshot(con):
        newest = con.execute(NEWEST_SAMPLE).fetchone()
        since, errors_after = (None, None) if newest is None else (int(newest[0]), int(newest[1]))
        queues = sorted({str(name) for statement in QUEUES for (name,) in con.execute(statement)})
        failed = {} if errors_after is None else _failed(con, errors_after)
        figures = [_queue_figures(con, queue, now_ms, since, failed.get(queue, 0)) for queue in queues]
        errors_seq = int(con.execute(LAST_ERROR).fetchone()[0])
        leases = [LeaseSeen(owner, job_id, token, until) for owner, job_id, token, until in con.execute(LEASES)]
    return Figures(now_ms, figures, errors_seq, leases)


def _failed(con: sqlite3.Connection, errors_after: int) -> dict[str, int]:
    rows = con.execute(FAILED, {"errors_seq": errors_after, "cap": FAILURES_CAP})
    return {str(queue): int(n) for queue, n in rows}


def _queue_figures(con: sqlite3.Connection, queue: str, now_ms: int, since: int | None, failed: int) -> QueueFigures:
    params: dict[str, Any] = {"queue": queue, "now": now_ms, "cap": DEPTH_CAP, "since": since}
    pending, ready, oldest = con.execute(PENDING, params).fetchone()
    leased = int(con.execute(LEASED, params).fetchone()[0])
    done = dead = 0
    if since is not None:
        untasked, tasked = (con.execute(statement, params).fetchone() for statement in (ENDED_UNTASKED, ENDED_TASKED))
        done, dead = int(untasked[0]) + int(tasked[0]), int(untasked[1]) + int(tasked[1])
    capped = pending >= DEPTH_CAP
    return QueueFigures(queue, pending, int(ready), leased, oldest, done, dead, failed, capped)


def write_sample(
    con: sqlite3.Connection, figures: Figures, workers: Sequence[WorkerLook], every_ms: int, keep_ms: int
) -> bool:
    """Write ``figures`` as a sample and the workers seen, unless another sample is too recent; forget what is
    older than ``keep_ms``. One write transaction."""
    at = figures.at_ms
    with write_transaction(con):
        newest = con.execute(NEWEST_SAMPLE).fetchone()
        if not is_due(None if newest is None else int(newest[0]), at, every_ms):
            return False
        con.executemany(
            INSERT_SAMPLE,
            [
                (at, q.queue, q.pending, q.ready, q.leased, q.oldest_ready_at, q.done, q.dead, q.failed, q.capped,
                 figures.errors_seq)
                for q in figures.queues
            ],
        )  # fmt: skip
        for look in workers:
            con.execute(SEE_WORKER, {"owner": look.owner, "now": at, "leases": look.leases, "renewals": look.renewals})
        con.execute(FORGET_SAMPLES, {"cutoff": at - keep_ms})
        con.execute(FORGET_WORKERS, {"cutoff": at - keep_ms})
    return True


def samples_since(con: sqlite3.Connection, since_ms: int) -> list[Sample]:
    """The samples from ``since_ms`` on, oldest first."""
    found: dict[int, list[QueueFigures]] = {}
    for at, *rest in con.execute(SAMPLES_SINCE, {"since": since_ms}):
        queue, pending, ready, leased, oldest, done, dead, failed, capped = rest
        found.setdefault(int(at), []).append(
            QueueFigures(queue, pending, ready, leased, oldest, done, dead, failed, bool(capped))
        )
    return [Sample(at, queues) for at, queues in found.items()]


def workers_seen(con: sqlite3.Connection) -> list[WorkerSeen]:
    """The lease holders the samples saw, the most recently seen first."""
    return [WorkerSeen(*row) for row in con.execute(WORKERS)]


def dead_groups(con: sqlite3.Connection, queue: str | None, scan: int) -> tuple[list[DeadGroup], int]:
    """The newest ``scan`` dead jobs grouped (``DEAD_GROUPS``), and how many were looked at; one snapshot."""
    params = {"queue": queue, "scan": scan}
    with snapshot(con):
        rows = con.execute(DEAD_GROUPS, params).fetchall()
        looked = int(con.execute(DEAD_LOOKED_AT, params).fetchone()[0])
    return [DeadGroup(q, reason, kind, n, job_id) for q, reason, kind, n, _seq, job_id in rows], looked
