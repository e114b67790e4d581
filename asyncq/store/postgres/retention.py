"""The retention step on PostgreSQL (``docs/flow-control.md``, "Retention"; the SQLite store's ``retention``): the
groups of ended jobs a run looks at, and one bounded step removing a group's jobs past its window, in the caller's
transaction. Both use ``jobs_retained`` (``(queue, task, status, reason, available_at)`` over the done and dead rows),
never a scan of the table: the groups by skipping through it (one seek per queue and per task found), a step one
range per cell of its state (``core.retention.STATE_CELLS``). The removal is the one ``prune`` uses
(``admin.REMOVE_DOOMED``: the rows locked ``FOR UPDATE SKIP LOCKED`` and re-checked, so a job redriven since the
snapshot stays).
"""

from __future__ import annotations

from collections.abc import Sequence

from asyncq.core.retention import STATE_CELLS
from asyncq.store.postgres.admin import REMOVE_DOOMED, q
from asyncq.store.postgres.connection import Connection
from asyncq.store.postgres.graph_schema import NEEDED_BY_GRAPH
from asyncq.store.postgres.schema import ENDED_AT

_ENDED = "status IN ('done', 'dead')"

# One retention step on one cell: the jobs of a queue ($1) and task ($7; NULL: those without one) of a status ($2)
# and reason ($6; NULL for the done cell) whose ``available_at`` and end are before $3, from the range of the index
# that holds them (no order: any expired rows will do, so nothing is sorted), at most $5; a done job whose result is
# kept past $4 (now) stays, and so does a job a graph still needs (``graph_schema.NEEDED_BY_GRAPH``). A NULL task or
# reason is a statement of its own (``IS NULL``), so that each seeks ``jobs_retained``. The result is looked up per
# row by its primary key (a scalar subquery: a NOT EXISTS became an anti-join reading every result still kept, at
# each step).
_EXPIRED = f"""SELECT seq FROM {{{{schema}}}}.jobs j WHERE {_ENDED} AND queue = $1 AND {{task}} AND status = $2
  AND {{reason}} AND available_at < $3 AND {ENDED_AT} < $3
  AND coalesce((SELECT r.expires_at FROM {{{{schema}}}}.results r WHERE r.job_seq = j.seq), 0) <= $4
  AND NOT {NEEDED_BY_GRAPH.replace("{", "{{").replace("}", "}}")}
  LIMIT $5"""
_TASK = {True: "task IS NULL AND $7::text IS NULL", False: "task = $7"}
_REASON = {True: "reason IS NULL AND $6::text IS NULL", False: "reason = $6"}
#: The step's statement by (the reason is NULL, the task is NULL).
EXPIRED_BATCH = {
    (no_reason, no_task): REMOVE_DOOMED.format(doomed=_EXPIRED.format(reason=_REASON[no_reason], task=_TASK[no_task]))
    for no_reason in (True, False)
    for no_task in (True, False)
}
# The queues that have ended jobs, by skipping through the index: each step seeks the next queue's first entry.
QUEUES_ENDED = f"""WITH RECURSIVE found(queue) AS (
  SELECT (SELECT queue FROM {{schema}}.jobs WHERE {_ENDED} ORDER BY queue LIMIT 1)
  UNION ALL
  SELECT (SELECT queue FROM {{schema}}.jobs WHERE {_ENDED} AND queue > found.queue ORDER BY queue LIMIT 1)
  FROM found WHERE found.queue IS NOT NULL
)
SELECT queue FROM found WHERE queue IS NOT NULL"""
# The tasks of one queue's ($1) ended jobs, the same way. The row comparison on ``(queue, task)`` is the index's own
# prefix: with a plain ``task > …`` the planner preferred walking ``jobs_task`` (every status of every queue) and
# filtering, cheap only while the queue's ended jobs are many. No task is empty, so ``''`` is before every task and
# after none (a NULL task never compares greater).
TASKS_ENDED = f"""WITH RECURSIVE found(task) AS (
  SELECT (SELECT task FROM {{schema}}.jobs WHERE {_ENDED} AND queue = $1 AND (queue, task) > ($1, '')
          ORDER BY queue, task LIMIT 1)
  UNION ALL
  SELECT (SELECT task FROM {{schema}}.jobs WHERE {_ENDED} AND queue = $1 AND (queue, task) > ($1, found.task)
          ORDER BY queue, task LIMIT 1)
  FROM found WHERE found.task IS NOT NULL
)
SELECT task FROM found WHERE task IS NOT NULL"""
# Whether one queue ($1) has ended jobs without a task: the NULL tasks sort last in the index, so the queue's last
# entry says (read backwards: a plain ``EXISTS … task IS NULL`` was planned as a scan of the table).
UNTASKED_ENDED = f"""SELECT coalesce((SELECT task IS NULL FROM {{schema}}.jobs WHERE {_ENDED} AND queue = $1
  ORDER BY queue DESC, task DESC NULLS FIRST LIMIT 1), false)"""


async def ended_groups(conn: Connection, schema: str, queues: Sequence[str] | None) -> list[tuple[str, str | None]]:
    """The ``(queue, task)`` groups of ended jobs (``None``: the jobs without a task) of ``queues``, or of every
    queue (``None``), by queue then task, those without one first."""
    if queues is None:
        queues = [row[0] for row in await conn.fetch(q(QUEUES_ENDED, schema))]
    groups: list[tuple[str, str | None]] = []
    for queue in queues:
        if await conn.fetchval(q(UNTASKED_ENDED, schema), queue):
            groups.append((queue, None))
        groups += [(queue, row[0]) for row in await conn.fetch(q(TASKS_ENDED, schema), queue)]
    return groups


async def remove_expired(
    conn: Connection, schema: str, queue: str, task: str | None, state: str, cutoff_ms: int, now_ms: int, limit: int
) -> int:
    """One retention step in the caller's transaction (``EXPIRED_BATCH``, cell by cell of the state): how many jobs
    of ``queue`` and ``task`` it removed."""
    removed = 0
    for status, reason in STATE_CELLS[state]:
        statement = q(EXPIRED_BATCH[reason is None, task is None], schema)
        row = await conn.fetchrow(statement, queue, status, cutoff_ms, now_ms, limit - removed, reason, task)
        assert row is not None
        removed += int(row[0])
        if removed >= limit:
            break
    return removed
