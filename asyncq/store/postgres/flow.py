"""A queue's stored flow-control settings on PostgreSQL (``queues``) and their audit (``queue_audit``): pause,
resume, ``max_wait``, retention and limits, each in the caller's transaction with its audit row, decided on the
settings row locked. The claim statement reads the row itself (``statements.CLAIM``): a claim that begins after a
pause committed takes nothing from the queue, on any host."""

from __future__ import annotations

from asyncq.core.flow import (
    LIMITS,
    MAX_WAIT,
    PAUSE,
    RESUME,
    RETENTION,
    QueueAuditEntry,
    QueueSettings,
    pause_refused,
)
from asyncq.core.flow_limits import UNLIMITED, Limits, rate_state_kept
from asyncq.core.retention import FOREVER, Windows
from asyncq.store.postgres.connection import Connection

_RETAIN = "retain_done_ms, retain_dead_ms, retain_cancelled_ms"
_LIMITS = "limit_concurrency, limit_per_key, limit_rate, limit_per_ms, limit_burst"
_COLUMNS = f"queue, paused_at, paused_by, note, max_wait_ms, {_RETAIN}, {_LIMITS}"
ENSURE_ROW = "INSERT INTO {schema}.queues (queue) VALUES ($1) ON CONFLICT (queue) DO NOTHING"
LOCK_SETTINGS = f"SELECT {_COLUMNS} FROM {{schema}}.queues WHERE queue = $1 FOR UPDATE"
ALL_SETTINGS = f"SELECT {_COLUMNS} FROM {{schema}}.queues ORDER BY queue"
SET_PAUSED = "UPDATE {schema}.queues SET paused_at = $2, paused_by = $3, note = $4 WHERE queue = $1"
SET_MAX_WAIT = "UPDATE {schema}.queues SET max_wait_ms = $2 WHERE queue = $1"
SET_RETENTION = (
    "UPDATE {schema}.queues SET retain_done_ms = $2, retain_dead_ms = $3, retain_cancelled_ms = $4 WHERE queue = $1"
)
SET_LIMITS = (
    "UPDATE {schema}.queues SET limit_concurrency = $2, limit_per_key = $3, limit_rate = $4, limit_per_ms = $5,"
    " limit_burst = $6, rate_tat_us = $7 WHERE queue = $1"
)
RATE_STATE = "SELECT rate_tat_us FROM {schema}.queues WHERE queue = $1"
_AUDIT_COLUMNS = f"seq, queue, action, at_ms, actor, note, max_wait_ms, {_RETAIN}, {_LIMITS}"
AUDIT_MOVE = f"""
INSERT INTO {{schema}}.queue_audit (queue, action, at_ms, actor, note, max_wait_ms, {_RETAIN}, {_LIMITS})
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14)
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
    return QueueSettings(*row)


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
    conn: Connection, schema: str, queue: str, windows: Windows, now_ms: int, note: str, actor: str
) -> QueueAuditEntry:
    """Set ``queue``'s three retention windows (``None``: for ever) with their audit row, which is returned."""
    await _locked(conn, schema, queue)
    await conn.execute(SET_RETENTION.format(schema=schema), queue, *windows)
    return await _audit(conn, schema, queue, RETENTION, now_ms, actor, note, None, windows)


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
    *,
    limits: Limits = UNLIMITED,
) -> QueueAuditEntry:
    statement = AUDIT_MOVE.format(schema=schema)
    row = await conn.fetchrow(statement, queue, action, now_ms, actor, note, max_wait_ms, *windows, *limits)
    assert row is not None  # INSERT … RETURNING returns the row it inserted
    return QueueAuditEntry(*row)


async def all_settings(conn: Connection, schema: str) -> list[QueueSettings]:
    """Every queue's stored settings, by name."""
    return [QueueSettings(*row) for row in await conn.fetch(ALL_SETTINGS.format(schema=schema))]


async def audit_log(conn: Connection, schema: str, queue: str | None, limit: int) -> list[QueueAuditEntry]:
    """The newest ``limit`` moves on queues (on ``queue`` only, if named), newest first."""
    return [QueueAuditEntry(*row) for row in await conn.fetch(AUDIT_LOG.format(schema=schema), queue, limit)]
