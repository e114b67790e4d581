"""An operator's console actions on SQLite, each one write transaction: the set found again and checked against the
preview (``core.operations.check_same_set``), every member moved by the engine's own statements (a redrive, a cancel
decided by ``decide_cancel``, its graph settled) or fenced by its status (a delete, a new priority), each with its
job audit row, then one operator audit row (``asyncq_operations``) that those rows name. A delete's set leaves out
what a graph still needs (``graph_schema.NEEDED_BY_GRAPH``); schedules move by ``schedules``' own steps. Also the
operator audit's reads."""

from __future__ import annotations

import json
import sqlite3
from typing import Any

from asyncq.core.dependencies import Ripple
from asyncq.core.jobs import Job
from asyncq.core.lifecycle import CancelState
from asyncq.core.operations import (
    BULK_SCAN,
    CANCEL,
    DELETE,
    ENDED_BY_GRAPH,
    PAUSE,
    PAUSE_SCHEDULE,
    PRIORITY,
    QUEUE_ACTIONS,
    REDRIVE,
    RUN_SCHEDULE,
    SCHEDULE_ACTIONS,
    SPARES_GRAPHS,
    AuditQuery,
    Operation,
    OperationEntry,
    Selection,
    check_same_set,
    queue_set,
    schedule_set,
    selection_plan,
)
from asyncq.core.search import MAX_IDS, JobQuery
from asyncq.errors import SetChanged
from asyncq.store.sqlite import engine, flow, schedules
from asyncq.store.sqlite.admin import last_audit_of
from asyncq.store.sqlite.connection import write_transaction
from asyncq.store.sqlite.graph_schema import NEEDED_BY_GRAPH, REMOVE_EDGES
from asyncq.store.sqlite.schema import PRODUCT
from asyncq.store.sqlite.search import search_in_transaction

_JOBS, _AUDIT = PRODUCT.jobs, PRODUCT.audit
_SEQS = "(SELECT value FROM json_each(:seqs))"
ENTRY_COLUMNS = "seq, at_ms, actor, role, action, note, filter, count, ids, digest, outcome"
INSERT_ENTRY = f"""
INSERT INTO asyncq_operations (at_ms, actor, role, action, note, filter, count, ids, digest, outcome)
VALUES (:now, :actor, :role, :action, :note, :filter, :count, :ids, :digest, :outcome) RETURNING {ENTRY_COLUMNS}
"""
NAME_ENTRY = f"UPDATE {_AUDIT} SET op_seq = :op WHERE seq IN {_SEQS}"
# A delete and a new priority are fenced by the status they apply to: a row that moved since it was found is
# not touched (and the action is then refused whole, ``SetChanged``).
DELETE_ROWS = (
    f"DELETE FROM {PRODUCT.errors} WHERE job_seq IN {_SEQS}",
    f"DELETE FROM {PRODUCT.results} WHERE job_seq IN {_SEQS}",
    f"DELETE FROM {_JOBS} WHERE seq IN {_SEQS} AND status IN ('pending', 'done', 'dead')",
)
SET_PRIORITY = f"UPDATE {_JOBS} SET priority = :priority WHERE seq IN {_SEQS} AND status IN ('pending', 'waiting')"
NEEDED = f"SELECT j.seq FROM {_JOBS} j WHERE j.seq IN {_SEQS} AND {NEEDED_BY_GRAPH}"
AUDIT_MOVE = f"""
INSERT INTO {_AUDIT} (id, job_seq, token, at_ms, note, action, reason) VALUES (:id, :seq, :token, :now, :note, :action,
  NULL) RETURNING seq
"""
# The newest ``:scan`` entries before ``:before``, those the query finds among them.
FIND_ENTRIES = f"""
SELECT {ENTRY_COLUMNS} FROM (SELECT * FROM asyncq_operations WHERE seq < :before ORDER BY seq DESC LIMIT :scan) o
WHERE (:actor IS NULL OR actor = :actor) AND (:action IS NULL OR action = :action)
  AND (:subject IS NULL OR EXISTS (SELECT 1 FROM json_each(o.ids) WHERE value = :subject))
  AND (:text IS NULL OR instr(note, :text) > 0)
ORDER BY seq DESC LIMIT :limit
"""
REACH = (
    "SELECT count(*), min(seq) FROM"
    " (SELECT seq FROM asyncq_operations WHERE seq < :before ORDER BY seq DESC LIMIT :scan)"
)
ENTRIES_BY_SEQ = f"SELECT {ENTRY_COLUMNS} FROM asyncq_operations WHERE seq IN {_SEQS}"


def entry_of(row: Any) -> OperationEntry:
    """An operator audit entry from its row (``ENTRY_COLUMNS``)."""
    seq, at_ms, actor, role, action, note, filter_json, count, ids_json, digest, outcome_json = row
    return OperationEntry(
        seq, at_ms, actor, role, action, note, json.loads(filter_json), count, tuple(json.loads(ids_json)), digest,
        json.loads(outcome_json),
    )  # fmt: skip


def operate(con: sqlite3.Connection, operation: Operation, now_ms: int, ripple: Ripple) -> OperationEntry:
    """Carry out ``operation`` in one write transaction (the module's docstring); its operator audit entry. ``ripple``
    counts the jobs a cancel's settled graphs released."""
    with write_transaction(con):
        audited: list[int] = []
        if operation.action in QUEUE_ACTIONS:
            ids, outcome = _on_queues(con, operation, now_ms)
            filter_: dict[str, Any] = {"queues": list(operation.queues)}
        elif operation.action in SCHEDULE_ACTIONS:
            ids, outcome, filter_ = _on_schedules(con, operation, now_ms)
        else:
            jobs = _found_again(con, operation)
            ids = [job.id for job in jobs]
            audited, outcome = _ACTS[operation.action](con, operation, jobs, now_ms, ripple)
            filter_ = operation.query.as_dict()
        params = {"now": now_ms, "actor": operation.actor, "role": operation.role, "action": operation.action}
        params |= {"note": operation.note, "filter": json.dumps(filter_), "count": len(ids)}
        params |= {"ids": json.dumps(ids), "digest": operation.digest, "outcome": json.dumps(outcome)}
        entry = entry_of(con.execute(INSERT_ENTRY, params).fetchone())
        con.execute(NAME_ENTRY, {"op": entry.seq, "seqs": json.dumps(audited)})
        return entry


def find_set(con: sqlite3.Connection, action: str, query: JobQuery) -> Selection:
    """A job action's set, as its preview and the action itself find it (``ConsoleStore.select``), in the caller's
    transaction: a delete's leaves out what a graph still needs."""
    page = search_in_transaction(con, selection_plan(action, query), None, MAX_IDS, BULK_SCAN, body=False)
    capped = page.next is not None
    if action not in SPARES_GRAPHS or not page.jobs:
        return Selection(page.jobs, capped)
    needed = {seq for (seq,) in con.execute(NEEDED, {"seqs": json.dumps([job.seq for job in page.jobs])})}
    kept = [job for job in page.jobs if job.seq not in needed]
    return Selection(kept, capped, [job for job in page.jobs if job.seq in needed])


def _found_again(con: sqlite3.Connection, operation: Operation) -> list[Job]:
    jobs = find_set(con, operation.action, operation.query).jobs
    check_same_set(operation.action, operation.count, operation.digest, [_member(job) for job in jobs])
    return jobs


def _member(job: Job) -> tuple[int, str, str, int]:
    """What a set's digest pins of a job (``core.operations.set_digest``)."""
    return (job.seq, job.id, job.status, job.token)


Acted = tuple[list[int], dict[str, int]]


def _redrive(con: sqlite3.Connection, op: Operation, jobs: list[Job], now_ms: int, _ripple: Ripple) -> Acted:
    audited = []
    for job in jobs:  # a key held (UniqueConflict) or a dependency still dead (ValueError): all rolls back
        engine.redrive_in_transaction(con, PRODUCT, job.id, now_ms, now_ms + op.ttl_ms, op.note)
        audited.append(last_audit_of(con, job.id).seq)
    return audited, {"redriven": len(jobs)}


def _cancel(con: sqlite3.Connection, op: Operation, jobs: list[Job], now_ms: int, ripple: Ripple) -> Acted:
    audited: list[int] = []
    outcome = {"cancelled": 0, "requested": 0, "requested before": 0}
    for job in jobs:
        decided, wrote, _status = engine.cancel_in_transaction(con, PRODUCT, job.id, now_ms, op.note, ripple)
        if decided is CancelState.TOO_LATE:  # under the write lock only an earlier member's graph ended it
            outcome[ENDED_BY_GRAPH] = outcome.get(ENDED_BY_GRAPH, 0) + 1
            continue
        outcome[decided.value if wrote else "requested before"] += 1
        if wrote:
            audited.append(last_audit_of(con, job.id).seq)
    return audited, outcome


def _delete(con: sqlite3.Connection, op: Operation, jobs: list[Job], now_ms: int, _ripple: Ripple) -> Acted:
    audited = _audit_moves(con, op, jobs, DELETE, now_ms)
    seqs = json.dumps([job.seq for job in jobs])
    for statement in (*DELETE_ROWS[:-1], *REMOVE_EDGES):
        con.execute(statement, {"seqs": seqs})
    if con.execute(DELETE_ROWS[-1], {"seqs": seqs}).rowcount != len(jobs):
        raise SetChanged(op.count, len(jobs) - 1)
    return audited, {"deleted": len(jobs)}


def _priority(con: sqlite3.Connection, op: Operation, jobs: list[Job], now_ms: int, _ripple: Ripple) -> Acted:
    audited = _audit_moves(con, op, jobs, PRIORITY, now_ms)
    changed = con.execute(SET_PRIORITY, {"seqs": json.dumps([job.seq for job in jobs]), "priority": op.priority})
    if changed.rowcount != len(jobs):
        raise SetChanged(op.count, changed.rowcount)
    return audited, {"changed": len(jobs)}


_ACTS = {REDRIVE: _redrive, CANCEL: _cancel, DELETE: _delete, PRIORITY: _priority}


def _audit_moves(con: sqlite3.Connection, op: Operation, jobs: list[Job], action: str, now_ms: int) -> list[int]:
    """A job audit row per job (``delete``, ``priority``), before its move; their seqs."""
    return [
        int(con.execute(AUDIT_MOVE, {"id": job.id, "seq": job.seq, "token": job.token, "now": now_ms,
                                     "note": op.note, "action": action}).fetchone()[0])
        for job in jobs
    ]  # fmt: skip


def _on_queues(con: sqlite3.Connection, op: Operation, now_ms: int) -> tuple[list[str], dict[str, int]]:
    """A pause or resume of the named queues that are running (paused), each with its queue audit row."""
    states = {queue: queue_state(con, queue) for queue in op.queues}
    members = queue_set(op.action, states)
    check_same_set(op.action, op.count, op.digest, list(members))
    for queue, _at in members:
        flow.set_paused_in_transaction(con, queue, op.action == PAUSE, now_ms, op.note, op.actor)
    return [queue for queue, _at in members], {"paused" if op.action == PAUSE else "resumed": len(members)}


def _on_schedules(
    con: sqlite3.Connection, op: Operation, now_ms: int
) -> tuple[list[str], dict[str, int], dict[str, Any]]:
    """A pause, resume or run now of the named schedules it applies to, each with its schedule event (who, why);
    the names, the outcome, and the filter (with the jobs a run now enqueued)."""
    members = schedule_set(op.action, schedules.named(con, op.schedules))
    check_same_set(op.action, op.count, op.digest, list(members))
    names = [name for name, _at in members]
    filter_: dict[str, Any] = {"schedules": list(op.schedules)}
    if op.action == RUN_SCHEDULE:
        events = [schedules.run_now_in_transaction(con, name, now_ms, op.note, op.actor) for name in names]
        return names, {"enqueued": len(names)}, filter_ | {"jobs": [event.job_id for event in events]}
    pausing = op.action == PAUSE_SCHEDULE
    for name in names:
        schedules.set_paused_in_transaction(con, name, pausing, now_ms, op.note, op.actor)
    return names, {"paused" if pausing else "resumed": len(names)}, filter_


def queue_state(con: sqlite3.Connection, queue: str) -> int | None:
    """``queue``'s ``paused_at`` (``None``: it runs)."""
    settings = flow.settings_of(con, queue)
    return None if settings is None else settings.paused_at


def find_entries(con: sqlite3.Connection, query: AuditQuery) -> tuple[list[OperationEntry], int | None]:
    """The entries ``query`` finds among the ``scan`` newest before ``before``, and where to go on from when the
    scan was cut short (``None``: it reached the oldest)."""
    params: dict[str, Any] = {"before": query.before or 2**62, "scan": query.scan, "limit": query.limit}
    params |= {"actor": query.actor, "action": query.action, "subject": query.subject, "text": query.text}
    entries = [entry_of(row) for row in con.execute(FIND_ENTRIES, params)]
    if len(entries) == query.limit:
        return entries, entries[-1].seq
    count, oldest = con.execute(REACH, params).fetchone()
    return entries, oldest if count >= query.scan else None


def entries_by_seq(con: sqlite3.Connection, seqs: list[int]) -> dict[int, OperationEntry]:
    """The entries of these seqs, by seq."""
    entries = (entry_of(row) for row in con.execute(ENTRIES_BY_SEQ, {"seqs": json.dumps(seqs)}))
    return {entry.seq: entry for entry in entries}
