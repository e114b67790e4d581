"""A queue's stored flow-control settings on SQLite (``asyncq_queues``), the retention rules (``asyncq_retention``)
and their audit (``asyncq_queue_audit``): pause, resume, ``max_wait``, retention and limits, each one write
transaction with its audit row. The claim statement reads the settings row itself (``statements.CLAIM_RANKED``), so a
pause holds for every connection from its commit on."""

from __future__ import annotations

import sqlite3
from typing import Any

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
from asyncq.store.sqlite.connection import write_transaction

_RETAIN = "retain_done_ms, retain_dead_ms, retain_cancelled_ms"
_LIMITS = "limit_concurrency, limit_per_key, limit_rate, limit_per_ms, limit_burst"
# A queue's settings row with the windows of its own retention rule (``asyncq_retention``, task empty), if any.
_SETTINGS = (
    "SELECT q.queue, q.paused_at, q.paused_by, q.note, q.max_wait_ms, r.retain_done_ms, r.retain_dead_ms,"
    " r.retain_cancelled_ms, q.limit_concurrency, q.limit_per_key, q.limit_rate, q.limit_per_ms, q.limit_burst"
    " FROM asyncq_queues q LEFT JOIN asyncq_retention r ON r.queue = q.queue AND r.task = ''"
)
SETTINGS_OF = f"{_SETTINGS} WHERE q.queue = :queue"
ALL_SETTINGS = f"{_SETTINGS} ORDER BY q.queue"
SET_PAUSED = """
INSERT INTO asyncq_queues (queue, paused_at, paused_by, note) VALUES (:queue, :paused_at, :actor, :note)
ON CONFLICT (queue) DO UPDATE SET paused_at = excluded.paused_at, paused_by = excluded.paused_by,
  note = excluded.note
"""
SET_MAX_WAIT = """
INSERT INTO asyncq_queues (queue, max_wait_ms) VALUES (:queue, :max_wait_ms)
ON CONFLICT (queue) DO UPDATE SET max_wait_ms = excluded.max_wait_ms
"""
ENSURE_QUEUE = "INSERT INTO asyncq_queues (queue) VALUES (:queue) ON CONFLICT (queue) DO NOTHING"
# A rule per scope (``core.retention.stored_scope``: queue ``*`` is every queue, an empty task the whole queue).
SET_RULE = f"""
INSERT INTO asyncq_retention (queue, task, {_RETAIN}) VALUES (:queue, :task, :done_ms, :dead_ms, :cancelled_ms)
ON CONFLICT (queue, task) DO UPDATE SET retain_done_ms = excluded.retain_done_ms,
  retain_dead_ms = excluded.retain_dead_ms, retain_cancelled_ms = excluded.retain_cancelled_ms
"""
CLEAR_RULE = "DELETE FROM asyncq_retention WHERE queue = :queue AND task = :task"
ALL_RULES = f"SELECT queue, task, {_RETAIN} FROM asyncq_retention ORDER BY queue, task"
# The rate's state is kept as ``core.flow_limits.rate_state_kept`` says (the statement only writes it).
SET_LIMITS = f"""
INSERT INTO asyncq_queues (queue, {_LIMITS}, rate_tat_us)
VALUES (:queue, :concurrency, :per_key_concurrency, :rate, :per_ms, :burst, :tat_us)
ON CONFLICT (queue) DO UPDATE SET limit_concurrency = excluded.limit_concurrency,
  limit_per_key = excluded.limit_per_key, limit_rate = excluded.limit_rate, limit_per_ms = excluded.limit_per_ms,
  limit_burst = excluded.limit_burst, rate_tat_us = excluded.rate_tat_us
"""
RATE_STATE = "SELECT rate_tat_us FROM asyncq_queues WHERE queue = :queue"
_AUDIT_COLUMNS = f"seq, queue, action, at_ms, actor, note, max_wait_ms, {_RETAIN}, task, {_LIMITS}"
AUDIT_MOVE = f"""
INSERT INTO asyncq_queue_audit (queue, action, at_ms, actor, note, max_wait_ms, {_RETAIN}, task, {_LIMITS})
VALUES (:queue, :action, :now, :actor, :note, :max_wait_ms, :done_ms, :dead_ms, :cancelled_ms, :task, :concurrency,
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
        return set_paused_in_transaction(con, queue, paused, now_ms, note, actor)


def set_paused_in_transaction(
    con: sqlite3.Connection, queue: str, paused: bool, now_ms: int, note: str, actor: str
) -> QueueAuditEntry:
    """``set_paused`` inside the caller's write transaction (a console's bulk pause runs several)."""
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
    con: sqlite3.Connection,
    queue: str | None,
    task: str | None,
    windows: Windows | None,
    now_ms: int,
    note: str,
    actor: str,
) -> QueueAuditEntry:
    """Set the retention rule of a scope (``queue`` ``None``: every queue; ``task``: that task's jobs in ``queue``)
    to ``windows``, or clear it (``None``: its jobs follow the wider rule again), with its audit row, which is
    returned. Clearing a scope that has no rule is a ``ValueError`` (nothing written)."""
    stored, stored_task = stored_scope(queue, task)
    scope = {"queue": stored, "task": stored_task}
    with write_transaction(con):
        if windows is None:
            if con.execute(CLEAR_RULE, scope).rowcount == 0:
                raise ValueError(f"{scope_text(queue, task)} has no retention rule of its own")
            return _audit(con, stored, RETENTION_CLEAR, now_ms, actor, note, None, task=task)
        if queue is not None:
            con.execute(ENSURE_QUEUE, {"queue": queue})
        con.execute(SET_RULE, scope | windows._asdict())
        return _audit(con, stored, RETENTION, now_ms, actor, note, None, windows, task)


def retention_rules(con: sqlite3.Connection) -> list[RetentionRule]:
    """Every stored retention rule: the default first, then by queue, a queue's own before its tasks'."""
    return [rule_of_row(*row) for row in con.execute(ALL_RULES)]


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
    task: str | None = None,
    *,
    limits: Limits = UNLIMITED,
) -> QueueAuditEntry:
    params = {"queue": queue, "action": action, "now": now_ms, "actor": actor, "note": note, "task": task}
    params |= {"max_wait_ms": max_wait_ms, **windows._asdict(), **limits._asdict()}
    return QueueAuditEntry(*con.execute(AUDIT_MOVE, params).fetchone())


def audit_log(con: sqlite3.Connection, queue: str | None, limit: int) -> list[QueueAuditEntry]:
    """The newest ``limit`` moves on queues (on ``queue`` only, if named), newest first."""
    return [QueueAuditEntry(*row) for row in con.execute(AUDIT_LOG, {"queue": queue, "limit": limit})]
