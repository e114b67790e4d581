"""What the console samples on PostgreSQL (``core.samples``; the SQLite driver's ``samples`` in PostgreSQL's words):
every queue's figures read in one snapshot from the partial indexes (the queues by a skip scan of each index that
leads with the queue; per queue a few seeks and bounded counts), written as one sample; the samples and the
workers seen read back; the dead jobs grouped by reason and their newest error's type."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from asyncq.core.samples import (
    DEPTH_CAP,
    FAILURES_CAP,
    Figures,
    LeaseSeen,
    QueueFigures,
    Sample,
    Totals,
    WorkerLook,
    WorkerSeen,
    is_due,
)
from asyncq.core.search import DeadGroup
from asyncq.core.stats import StatsReads, assemble_stats
from asyncq.store.postgres import admin
from asyncq.store.postgres.connection import Connection, advisory_key

_SKIP_SCAN = """
WITH RECURSIVE q(name) AS (
  SELECT (SELECT min(queue) FROM {{schema}}.jobs WHERE {where})
  UNION ALL
  SELECT (SELECT min(queue) FROM {{schema}}.jobs WHERE {where} AND queue > q.name) FROM q WHERE q.name IS NOT NULL
) SELECT name FROM q WHERE name IS NOT NULL
"""
_INDEXED = ("status = 'pending'", "status = 'leased'", "status IN ('done', 'dead')")
QUEUES = (*(_SKIP_SCAN.format(where=where) for where in _INDEXED), "SELECT queue FROM {schema}.queues")
# A queue's pending jobs in one pass of jobs_waiting (queue, available_at), the soonest due first, at most $3: how
# many, how many of them are ready at $2, and the oldest ready one.
PENDING = """
SELECT count(*), count(*) FILTER (WHERE available_at <= $2), min(available_at) FILTER (WHERE available_at <= $2)
FROM (SELECT available_at FROM {schema}.jobs WHERE status = 'pending' AND queue = $1 ORDER BY available_at LIMIT $3) p
"""
LEASED = "SELECT count(*) FROM {schema}.jobs WHERE status = 'leased' AND queue = $1"
# Jobs that ended since the previous sample: one seek of each cell per task of the queue in the ended jobs' index, and
# of the jobs without a task (the SQLite driver's ``ENDED_UNTASKED``, ``ENDED_TASKED``). The queue's tasks are found
# by skipping through that index with the row comparison alone as each step's start (``TASKS_OF``): a step that also
# says ``queue = $1`` starts at the queue's first entry and walks every entry before the next task (measured at a
# million jobs: 14 ms a step, against 0.01 ms), and the first entry of another queue ends the walk.
TASKS_OF = """WITH RECURSIVE found(task) AS (
  SELECT (SELECT CASE WHEN queue = $1 THEN task END FROM {schema}.jobs WHERE status IN ('done', 'dead')
          AND (queue, task) > ($1, '') ORDER BY queue, task LIMIT 1)
  UNION ALL
  SELECT (SELECT CASE WHEN queue = $1 THEN task END FROM {schema}.jobs WHERE status IN ('done', 'dead')
          AND (queue, task) > ($1, found.task) ORDER BY queue, task LIMIT 1)
  FROM found WHERE found.task IS NOT NULL
)
SELECT task FROM found WHERE task IS NOT NULL"""
_ENDED = """(SELECT count(*) FROM {{schema}}.jobs WHERE status IN ('done', 'dead') AND queue = $1 AND task {task}
  AND {cell} AND available_at > $2 AND available_at <= $3)"""
_DONE = "status = 'done' AND reason IS NULL"
_DEAD = "status = 'dead' AND reason IN ('deadline', 'exhausted', 'permanent', 'cancelled')"
ENDED_UNTASKED = "SELECT " + ", ".join(_ENDED.format(task="IS NULL", cell=cell) for cell in (_DONE, _DEAD))
ENDED_TASKED = (
    "SELECT coalesce(sum(done), 0), coalesce(sum(dead), 0) FROM (SELECT "
    + ", ".join(
        _ENDED.format(task="= f.task", cell=cell) + f" AS {name}" for name, cell in (("done", _DONE), ("dead", _DEAD))
    )
    + f" FROM ({TASKS_OF}) f) c"
)
FAILED = """
SELECT j.queue, count(*) FROM (SELECT job_seq FROM {schema}.errors WHERE seq > $1 ORDER BY seq LIMIT $2) e
JOIN {schema}.jobs j ON j.seq = e.job_seq GROUP BY j.queue
"""
LAST_ERROR = "SELECT coalesce(max(seq), 0) FROM {schema}.errors"
LEASES = "SELECT owner, id, token, lease_until FROM {schema}.jobs WHERE status = 'leased'"
NEWEST_SAMPLE = "SELECT at_ms, errors_seq FROM {schema}.samples ORDER BY at_ms DESC LIMIT 1"
_FIGURES = "queue, pending, ready, leased, oldest_ready_at, done, dead, failed, capped"
INSERT_SAMPLE = f"""
INSERT INTO {{schema}}.samples (at_ms, {_FIGURES}, errors_seq)
SELECT $1, u.*, $11::bigint FROM unnest($2::text[], $3::bigint[], $4::bigint[], $5::bigint[], $6::bigint[],
  $7::bigint[], $8::bigint[], $9::bigint[], $10::boolean[]) AS u
ON CONFLICT (at_ms, queue) DO NOTHING
"""
SAMPLES_SINCE = f"SELECT at_ms, {_FIGURES} FROM {{schema}}.samples WHERE at_ms >= $1 ORDER BY at_ms, queue"
FORGET_SAMPLES = "DELETE FROM {schema}.samples WHERE at_ms < $1"
SEE_WORKERS = """
INSERT INTO {schema}.workers_seen AS w (owner, first_seen_ms, last_seen_ms, leases, renewals, last_renewal_ms)
SELECT owner, $1::bigint, $1::bigint, leases, renewals, CASE WHEN renewals > 0 THEN $1::bigint END
FROM unnest($2::text[], $3::integer[], $4::bigint[]) AS s(owner, leases, renewals)
ON CONFLICT (owner) DO UPDATE SET last_seen_ms = $1, leases = EXCLUDED.leases,
  renewals = w.renewals + EXCLUDED.renewals,
  last_renewal_ms = CASE WHEN EXCLUDED.renewals > 0 THEN $1 ELSE w.last_renewal_ms END
"""
FORGET_WORKERS = "DELETE FROM {schema}.workers_seen WHERE last_seen_ms < $1"
WORKERS = """
SELECT owner, first_seen_ms, last_seen_ms, leases, renewals, last_renewal_ms FROM {schema}.workers_seen
ORDER BY last_seen_ms DESC, owner COLLATE "C" LIMIT 1000
"""
_NEWEST_DEAD = "SELECT seq FROM {schema}.jobs WHERE status = 'dead' ORDER BY seq DESC LIMIT $2"
# Each dead job looked up by its key in a LATERAL subquery (its LIMIT 1 keeps the planner from folding it into a
# join that scans the whole table).
DEAD_GROUPS = f"""
SELECT j.queue, j.reason,
  (SELECT e.type FROM {{schema}}.errors e WHERE e.job_seq = j.seq ORDER BY e.seq DESC LIMIT 1) AS type,
  count(*), (array_agg(j.id ORDER BY j.seq DESC))[1]
FROM ({_NEWEST_DEAD}) d CROSS JOIN LATERAL (
  SELECT seq, id, queue, reason FROM {{schema}}.jobs WHERE seq = d.seq AND ($1::text IS NULL OR queue = $1) LIMIT 1) j
GROUP BY 1, 2, 3
"""
DEAD_LOOKED_AT = f"SELECT count(*) FROM ({_NEWEST_DEAD.replace('$2', '$1')}) d"


def q(statement: str, schema: str) -> str:
    return statement.format(schema=schema)


async def totals(conn: Connection, schema: str, now_ms: int) -> Totals:
    """``Stats``' reads without the attempts histogram (it reads every live row), in the caller's snapshot."""
    reads = StatsReads(
        counts=[(status, reason, n) for status, reason, n in await conn.fetch(q(admin.COUNTS, schema))],
        attempts=[],
        leases=[(owner, n, first) for owner, n, first in await conn.fetch(q(admin.LEASES_BY_OWNER, schema))],
        expired=await conn.fetchval(q(admin.EXPIRED_LEASES, schema), now_ms),
        oldest_ready=await conn.fetchval(q(admin.OLDEST_READY, schema), now_ms),
    )
    return Totals.of(assemble_stats(now_ms, reads))


async def read_figures(conn: Connection, schema: str, now_ms: int) -> Figures:
    """Every queue's figures now and since the newest sample, in the caller's one snapshot."""
    newest = await conn.fetchrow(q(NEWEST_SAMPLE, schema))
    since, errors_after = (None, None) if newest is None else (int(newest[0]), int(newest[1]))
    queues = sorted({str(row[0]) for statement in QUEUES for row in await conn.fetch(q(statement, schema))})
    failed: dict[str, int] = {}
    if errors_after is not None:
        rows = await conn.fetch(q(FAILED, schema), errors_after, FAILURES_CAP)
        failed = {str(row[0]): int(row[1]) for row in rows}
    figures = [await _queue_figures(conn, schema, queue, now_ms, since, failed.get(queue, 0)) for queue in queues]
    errors_seq = int(await conn.fetchval(q(LAST_ERROR, schema)))
    leases = [LeaseSeen(*row) for row in await conn.fetch(q(LEASES, schema))]
    return Figures(now_ms, figures, errors_seq, leases)


async def _queue_figures(
    conn: Connection, schema: str, queue: str, now_ms: int, since: int | None, failed: int
) -> QueueFigures:
    found = await conn.fetchrow(q(PENDING, schema), queue, now_ms, DEPTH_CAP)
    assert found is not None
    pending, ready, oldest = int(found[0]), int(found[1]), found[2]
    leased = int(await conn.fetchval(q(LEASED, schema), queue))
    done = dead = 0
    if since is not None:
        for statement in (ENDED_UNTASKED, ENDED_TASKED):
            found = await conn.fetchrow(q(statement, schema), queue, since, now_ms)
            assert found is not None
            done, dead = done + int(found[0]), dead + int(found[1])
    return QueueFigures(queue, pending, ready, leased, oldest, done, dead, failed, pending >= DEPTH_CAP)


async def write_sample(
    conn: Connection, schema: str, figures: Figures, workers: Sequence[WorkerLook], every_ms: int, keep_ms: int
) -> bool:
    """Write ``figures`` as a sample and the workers seen, unless another sample is too recent (two consoles take
    turns under a transaction-scoped advisory lock); forget what is older than ``keep_ms``."""
    at = figures.at_ms
    await conn.execute("SELECT pg_advisory_xact_lock($1)", advisory_key(f"{schema}.samples"))
    newest = await conn.fetchrow(q(NEWEST_SAMPLE, schema))
    if not is_due(None if newest is None else int(newest[0]), at, every_ms):
        return False
    rows = figures.queues
    columns: list[Any] = [[getattr(row, name) for row in rows] for name in _FIGURES.split(", ")]
    await conn.execute(q(INSERT_SAMPLE, schema), at, *columns, figures.errors_seq)
    owners = [[look.owner for look in workers], [look.leases for look in workers], [look.renewals for look in workers]]
    await conn.execute(q(SEE_WORKERS, schema), at, *owners)
    await conn.execute(q(FORGET_SAMPLES, schema), at - keep_ms)
    await conn.execute(q(FORGET_WORKERS, schema), at - keep_ms)
    return True


async def samples_since(conn: Connection, schema: str, since_ms: int) -> list[Sample]:
    """The samples from ``since_ms`` on, oldest first."""
    found: dict[int, list[QueueFigures]] = {}
    for row in await conn.fetch(q(SAMPLES_SINCE, schema), since_ms):
        at, *rest = tuple(row)
        found.setdefault(int(at), []).append(QueueFigures(*rest))
    return [Sample(at, queues) for at, queues in found.items()]


async def workers_seen(conn: Connection, schema: str) -> list[WorkerSeen]:
    """The lease holders the samples saw, the most recently seen first."""
    return [WorkerSeen(*row) for row in await conn.fetch(q(WORKERS, schema))]


async def dead_groups(conn: Connection, schema: str, queue: str | None, scan: int) -> tuple[list[DeadGroup], int]:
    """The newest ``scan`` dead jobs grouped by queue, reason and newest error type, and how many were looked at."""
    rows = await conn.fetch(q(DEAD_GROUPS, schema), queue, scan)
    looked = int(await conn.fetchval(q(DEAD_LOOKED_AT, schema), scan))
    return [DeadGroup(*row) for row in rows], looked
