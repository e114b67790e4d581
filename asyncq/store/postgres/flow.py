"""A queue's stored flow-control settings on PostgreSQL (``queues``), the retention rules (``retention``) and their
audit (``queue_audit``): pause, resume, ``max_wait``, retention and limits, each in the caller's transaction with its
audit row, decided on the settings row locked. The claim statement reads the row itself (``statements.CLAIM``): a
claim that begins after a pause committed takes nothing from the queue, on any host."""

from __future__ import annotations

from asyncq.core.flow import (
    LIMITS,
    MAX_WAIT,
    PAUSE,
    RESUME,
    RETENTION,
    RETENTION_CLEAR,
    QueueAuditEntry,
    QueueSettings,
    pause_refused,
)
from asyncq.core.flow_limits import UNLIMITED, Limits, rate_state_kept
from asyncq.core.retention import FOREVER, RetentionRule, Windows, rule_of_row, scope_text, stored_scope
from asyncq.store.postgres.connection import Connection

_RETAIN = "retain_done_ms, retain_dead_ms, retain_cancelled_ms"
_LIMITS = "limit_concurrency, limit_per_key, limit_rate, limit_per_ms, limit_burst"
_COLUMNS = "queue, paused_at, paused_by, note, max_wait_ms"
# A queue's settings row with the windows of its own retention rule (``retention``, task empty), if any.
_WITH_RULE = (
    "SELECT q.queue, q.paused_at, q.paused_by, q.note, q.max_wait_ms, r.retain_done_ms, r.retain_dead_ms,"
    " r.retain_cancelled_ms, q.limit_concurrency, q.limit_per_key, q.limit_rate, q.limit_per_ms, q.limit_burst"
    " FROM {schema}.queues q LEFT JOIN {schema}.retention r ON r.queue = q.queue AND r.task = ''"
)
ENSURE_ROW = "INSERT INTO {schema}.queues (queue) VALUES ($1) ON CONFLICT (queue) DO NOTHING"
LOCK_SETTINGS = f"SELECT {_COLUMNS} FROM {{schema}}.queues WHERE queue = $1 FOR UPDATE"
ALL_SETTINGS = f"{_WITH_RULE} ORDER BY q.queue"
SET_PAUSED = "UPDATE {schema}.queues SET paused_at = $2, paused_by = $3, note = $4 WHERE queue = $1"
SET_MAX_WAIT = "UPDATE {schema}.queues SET max_wait_ms = $2 WHERE queue = $1"
# A rule per scope (``core.retention.stored_scope``: queue ``*`` is every queue, an empty task the whole queue).
SET_RULE = f"""INSERT INTO {{schema}}.retention AS r (queue, task, {_RETAIN}) VALUES ($1, $2, $3, $4, $5)
ON CONFLICT (queue, task) DO UPDATE SET retain_done_ms = EXCLUDED.retain_done_ms,
  retain_dead_ms = EXCLUDED.retain_dead_ms, retain_cancelled_ms = EXCLUDED.retain_cancelled_ms"""
CLEAR_RULE = "DELETE FROM {schema}.retention WHERE queue = $1 AND task = $2"
ALL_RULES = f"SELECT queue, task, {_RETAIN} FROM {{schema}}.retention ORDER BY queue, task"
SET_LIMITS = (
    "UPDATE {schema}.queues SET limit_concurrency = $2, limit_per_key = $3, limit_rate = $4, limit_per_ms = $5,"
    " limit_burst = $6, rate_tat_us = $7 WHERE queue = $1"
)
RATE_STATE = "SELECT rate_tat_us FROM {schema}.queues WHERE queue = $1"
_AUDIT_COLUMNS = f"seq, queue, action, at_ms, actor, note, max_wait_ms, {_RETAIN}, task, {_LIMITS}"
AUDIT_MOVE = f"""
INSERT INTO {{schema}}.queue_audit (queue, action, at_ms, actor, note, max_wait_ms, {_RETAIN}, task, {_LIMITS})
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15)
RETURNING {_AUDIT_COLUMNS}
"""
AUDIT_LOG = f"""
SELECT {_AUDIT_COLUMNS} FROM {{schema}}.queue_audit WHERE $1::text IS NULL OR queue = $1 ORDER BY seq DESC LIMIT $2
"""


async def _locked(conn: Connection, schema: str, queue: str) -> QueueSettings:
    """``queue``'s settings row, created if it was missing, locked until the transaction ends."""
    await conn.execute(ENSURE_ROW.format(schema=schema), queue)
    row = await conn.fetchrow(LOCK_SETTINGS.format(schema=schema), queue)
    assert row is not None  # the row was ensured in this transaction
    return QueueSettings(*row)  # the pause and max_wait columns: a move here reads no retention and no limits


async def set_paused(
    conn: Connection, schema: str, queue: str, paused: bool, now_ms: int, note: str, actor: str
) -> QueueAuditEntry:
    """Pause (or resume) ``queue`` with its audit row, which is returned; ``ValueError`` if it is paused
    already (or not paused): the caller's transaction then rolls back."""
    refused = pause_refused(queue, paused, await _locked(conn, schema, queue))
    if refused is not None:
        raise ValueError(refused)
    state = (now_ms, actor, note) if paused else (None, None, None)
    await conn.execute(SET_PAUSED.format(schema=schema), queue, *state)
    return await _audit(conn, schema, queue, PAUSE if paused else RESUME, now_ms, actor, note, None)


async def set_max_wait(
    conn: Connection, schema: str, queue: str, max_wait_ms: int | None, now_ms: int, note: str, actor: str
) -> QueueAuditEntry:
    """Set (``None``: clear) ``queue``'s ``max_wait`` with its audit row, which is returned."""
    await _locked(conn, schema, queue)
    await conn.execute(SET_MAX_WAIT.format(schema=schema), queue, max_wait_ms)
    return await _audit(conn, schema, queue, MAX_WAIT, now_ms, actor, note, max_wait_ms)


async def set_retention(
    conn: Connection,
    schema: str,
    queue: str | None,
    task: str | None,
    windows: Windows | None,
    now_ms: int,
    note: str,
    actor: str,
) -> QueueAuditEntry:
    """Set the retention rule of a scope (``queue`` ``None``: every queue; ``task``: that task's jobs in ``queue``)
    to ``windows``, or clear it (``None``), with its audit row, which is returned. Clearing a scope that has no rule
    is a ``ValueError``: the caller's transaction then rolls back."""
    stored, stored_task = stored_scope(queue, task)
    if windows is None:
        done = await conn.execute(CLEAR_RULE.format(schema=schema), stored, stored_task)
        if done == "DELETE 0":
            raise ValueError(f"{scope_text(queue, task)} has no retention rule of its own")
        return await _audit(conn, schema, stored, RETENTION_CLEAR, now_ms, actor, note, None, task=task)
    if queue is not None:
        await _locked(conn, schema, queue)
    await conn.execute(SET_RULE.format(schema=schema), stored, stored_task, *windows)
    return await _audit(conn, schema, stored, RETENTION, now_ms, actor, note, None, windows, task)


async def retention_rules(conn: Connection, schema: str) -> list[RetentionRule]:
    """Every stored retention rule: the default first, then by queue, a queue's own before its tasks'."""
    return [rule_of_row(*row) for row in await conn.fetch(ALL_RULES.format(schema=schema))]


async def set_limits(
    conn: Connection, schema: str, queue: str, limits: Limits, now_ms: int, note: str, actor: str
) -> QueueAuditEntry:
    """Set ``queue``'s limits (each ``None``: none) with their audit row, which is returned, on the settings row locked
    (a claim counting under the old limits has committed first); the rate's state as ``rate_state_kept`` says."""
    await _locked(conn, schema, queue)
    tat_us = rate_state_kept(limits, await conn.fetchval(RATE_STATE.format(schema=schema), queue), now_ms)
    await conn.execute(SET_LIMITS.format(schema=schema), queue, *limits, tat_us)
    return await _audit(conn, schema, queue, LIMITS, now_ms, actor, note, None, limits=limits)


async def _audit(
    conn: Connection,
    schema: str,
    queue: str,
    action: str,
    now_ms: int,
    actor: str,
    note: str,
    max_wait_ms: int | None,
    windows: Windows = FOREVER,
    task: str | None = None,
    *,
    limits: Limits = UNLIMITED,
) -> QueueAuditEntry:
    statement = AUDIT_MOVE.format(schema=schema)
    row = await conn.fetchrow(statement, queue, action, now_ms, actor, note, max_wait_ms, *windows, task, *limits)
    assert row is not None  # INSERT … RETURNING returns the row it inserted
    return QueueAuditEntry(*row)


async def all_settings(conn: Connection, schema: str) -> list[QueueSettings]:
    """Every queue's stored settings, by name."""
    return [QueueSettings(*row) for row in await conn.fetch(ALL_SETTINGS.format(schema=schema))]


async def audit_log(conn: Connection, schema: str, queue: str | None, limit: int) -> list[QueueAuditEntry]:
    """The newest ``limit`` moves on queues (on ``queue`` only, if named), newest first."""
    return [QueueAuditEntry(*row) for row in await conn.fetch(AUDIT_LOG.format(schema=schema), queue, limit)]
