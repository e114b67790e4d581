"""A queue's stored flow-control settings on SQLite (``asyncq_queues``) and their audit (``asyncq_queue_audit``):
pause, resume, ``max_wait``, retention and limits, each one write transaction with its audit row. The claim statement
reads the settings row itself (``statements.CLAIM_RANKED``), so a pause holds for every connection from its commit
on."""

from __future__ import annotations

import sqlite3
from typing import Any

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
from asyncq.store.sqlite.connection import write_transaction

_RETAIN = "retain_done_ms, retain_dead_ms, retain_cancelled_ms"
_LIMITS = "limit_concurrency, limit_per_key, limit_rate, limit_per_ms, limit_burst"
_COLUMNS = f"queue, paused_at, paused_by, note, max_wait_ms, {_RETAIN}, {_LIMITS}"
SETTINGS_OF = f"SELECT {_COLUMNS} FROM asyncq_queues WHERE queue = :queue"
ALL_SETTINGS = f"SELECT {_COLUMNS} FROM asyncq_queues ORDER BY queue"
SET_PAUSED = """
INSERT INTO asyncq_queues (queue, paused_at, paused_by, note) VALUES (:queue, :paused_at, :actor, :note)
ON CONFLICT (queue) DO UPDATE SET paused_at = excluded.paused_at, paused_by = excluded.paused_by,
  note = excluded.note
"""
SET_MAX_WAIT = """
INSERT INTO asyncq_queues (queue, max_wait_ms) VALUES (:queue, :max_wait_ms)
ON CONFLICT (queue) DO UPDATE SET max_wait_ms = excluded.max_wait_ms
"""
SET_RETENTION = f"""
INSERT INTO asyncq_queues (queue, {_RETAIN}) VALUES (:queue, :done_ms, :dead_ms, :cancelled_ms)
ON CONFLICT (queue) DO UPDATE SET retain_done_ms = excluded.retain_done_ms,
  retain_dead_ms = excluded.retain_dead_ms, retain_cancelled_ms = excluded.retain_cancelled_ms
"""
# The rate's state is kept as ``core.flow_limits.rate_state_kept`` says (the statement only writes it).
SET_LIMITS = f"""
INSERT INTO asyncq_queues (queue, {_LIMITS}, rate_tat_us)
VALUES (:queue, :concurrency, :per_key_concurrency, :rate, :per_ms, :burst, :tat_us)
ON CONFLICT (queue) DO UPDATE SET limit_concurrency = excluded.limit_concurrency,
  limit_per_key = excluded.limit_per_key, limit_rate = excluded.limit_rate, limit_per_ms = excluded.limit_per_ms,
  limit_burst = excluded.limit_burst, rate_tat_us = excluded.rate_tat_us
"""
RATE_STATE = "SELECT rate_tat_us FROM asyncq_queues WHERE queue = :queue"
_AUDIT_COLUMNS = f"seq, queue, action, at_ms, actor, note, max_wait_ms, {_RETAIN}, {_LIMITS}"
AUDIT_MOVE = f"""
INSERT INTO asyncq_queue_audit (queue, action, at_ms, actor, note, max_wait_ms, {_RETAIN}, {_LIMITS})
VALUES (:queue, :action, :now, :actor, :note, :max_wait_ms, :done_ms, :dead_ms, :cancelled_ms, :concurrency,
  :per_key_concurrency, :rate, :per_ms, :burst)
RETURNING {_AUDIT_COLUMNS}
"""
AUDIT_LOG = f"""
SELECT {_AUDIT_COLUMNS} FROM asyncq_queue_audit WHERE :queue IS NULL OR queue = :queue ORDER BY seq DESC LIMIT :limit
"""


def settings_of(con: sqlite3.Connection, queue: str) -> QueueSettings | None:
    row = con.execute(SETTINGS_OF, {"queue": queue}).fetchone()
    return None if row is None else QueueSettings(*row)


def all_settings(con: sqlite3.Connection) -> list[QueueSettings]:
    """Every queue's stored settings, by name (queues never set have no row)."""
    return [QueueSettings(*row) for row in con.execute(ALL_SETTINGS)]


def set_paused(
    con: sqlite3.Connection, queue: str, paused: bool, now_ms: int, note: str, actor: str
) -> QueueAuditEntry:
    """Pause (or resume) ``queue`` with its audit row, which is returned; ``ValueError`` (nothing changes) if it
    is paused already (or is not paused)."""
    with write_transaction(con):
        refused = pause_refused(queue, paused, settings_of(con, queue))
        if refused is not None:
            raise ValueError(refused)
        state: dict[str, Any] = {"queue": queue, "paused_at": None, "actor": None, "note": None}
        if paused:
            state |= {"paused_at": now_ms, "actor": actor, "note": note}
        con.execute(SET_PAUSED, state)
        return _audit(con, queue, PAUSE if paused else RESUME, now_ms, actor, note, None)


def set_max_wait(
    con: sqlite3.Connection, queue: str, max_wait_ms: int | None, now_ms: int, note: str, actor: str
) -> QueueAuditEntry:
    """Set (``None``: clear) ``queue``'s ``max_wait`` with its audit row, which is returned."""
    with write_transaction(con):
        con.execute(SET_MAX_WAIT, {"queue": queue, "max_wait_ms": max_wait_ms})
        return _audit(con, queue, MAX_WAIT, now_ms, actor, note, max_wait_ms)


def set_retention(
    con: sqlite3.Connection, queue: str, windows: Windows, now_ms: int, note: str, actor: str
) -> QueueAuditEntry:
    """Set ``queue``'s three retention windows (``None``: for ever) with their audit row, which is returned."""
    with write_transaction(con):
        con.execute(SET_RETENTION, {"queue": queue, **windows._asdict()})
        return _audit(con, queue, RETENTION, now_ms, actor, note, None, windows)


def set_limits(
    con: sqlite3.Connection, queue: str, limits: Limits, now_ms: int, note: str, actor: str
) -> QueueAuditEntry:
    """Set ``queue``'s limits (each ``None``: none) with their audit row, which is returned; the rate's state is kept
    as ``core.flow_limits.rate_state_kept`` says."""
    with write_transaction(con):
        row = con.execute(RATE_STATE, {"queue": queue}).fetchone()
        tat_us = rate_state_kept(limits, None if row is None else row[0], now_ms)
        con.execute(SET_LIMITS, {"queue": queue, "tat_us": tat_us, **limits._asdict()})
        return _audit(con, queue, LIMITS, now_ms, actor, note, None, limits=limits)


def _audit(
    con: sqlite3.Connection,
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
    params = {"queue": queue, "action": action, "now": now_ms, "actor": actor, "note": note}
    params |= {"max_wait_ms": max_wait_ms, **windows._asdict(), **limits._asdict()}
    return QueueAuditEntry(*con.execute(AUDIT_MOVE, params).fetchone())


def audit_log(con: sqlite3.Connection, queue: str | None, limit: int) -> list[QueueAuditEntry]:
    """The newest ``limit`` moves on queues (on ``queue`` only, if named), newest first."""
    return [QueueAuditEntry(*row) for row in con.execute(AUDIT_LOG, {"queue": queue, "limit": limit})]
