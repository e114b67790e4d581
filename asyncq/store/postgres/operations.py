"""An operator's console actions on PostgreSQL, each in the caller's one transaction: the set found again, its rows
locked in ``seq`` order and checked against the preview (``core.operations.check_same_set``), so that no other
transaction can move a member until the commit; every member then moved by ``transitions``' own steps (a redrive, a
cancel decided by ``decide_cancel``) or fenced by its status (a delete, a new priority), each with its job audit
row, then one operator audit row (``operations``) that those rows name; a member that does not move as checked
makes the whole action ``SetChanged`` and the transaction rolls back. A delete's set leaves out what a graph still
needs (``graph_schema.NEEDED_BY_GRAPH``), decided once its rows are locked (a new dependant of a locked job waits for
the commit); schedules move by ``schedules``' own steps, their rows locked. Also the operator audit's reads."""

from __future__ import annotations

import json
from dataclasses import replace
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
from asyncq.store.postgres import flow, schedules, transitions
from asyncq.store.postgres.connection import Connection
from asyncq.store.postgres.graph_schema import NEEDED_BY_GRAPH
from asyncq.store.postgres.search import numbered, search
from asyncq.store.postgres.statements import channel

ENTRY_COLUMNS = "seq, at_ms, actor, role, action, note, filter, count, ids, digest, outcome"
INSERT_ENTRY = f"""
INSERT INTO {{schema}}.operations (at_ms, actor, role, action, note, filter, count, ids, digest, outcome)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10) RETURNING {ENTRY_COLUMNS}
"""
NAME_ENTRY = "UPDATE {schema}.audit SET op_seq = $1 WHERE seq = ANY($2::bigint[])"
LOCK_SET = "SELECT seq, id, status, token FROM {schema}.jobs WHERE seq = ANY($1::bigint[]) ORDER BY seq FOR UPDATE"
LOCK_TO_DELETE = (
    "SELECT seq FROM {schema}.jobs WHERE seq = ANY($1::bigint[]) AND status IN ('pending', 'done', 'dead') FOR UPDATE"
)
DELETE_ROWS = (
    "DELETE FROM {schema}.errors WHERE job_seq = ANY($1::bigint[])",
    "DELETE FROM {schema}.results WHERE job_seq = ANY($1::bigint[])",
    "DELETE FROM {schema}.edges WHERE dependant = ANY($1::bigint[])",
    "DELETE FROM {schema}.edges WHERE dependency = ANY($1::bigint[])",
    "DELETE FROM {schema}.jobs WHERE seq = ANY($1::bigint[])",
)
SET_PRIORITY = (
    "UPDATE {schema}.jobs SET priority = $2 WHERE seq = ANY($1::bigint[]) AND status IN ('pending', 'waiting')"
)
NEEDED = "SELECT j.seq FROM {schema}.jobs j WHERE j.seq = ANY($1::bigint[]) AND " + NEEDED_BY_GRAPH
AUDIT_MOVES = """
INSERT INTO {schema}.audit (id, job_seq, token, at_ms, note, action, reason)
SELECT id, seq, token, $2, $3, $4, NULL FROM unnest($1::text[], $5::bigint[], $6::bigint[]) AS m(id, seq, token)
RETURNING seq
"""
QUEUE_STATES = "SELECT queue, paused_at FROM {schema}.queues WHERE queue = ANY($1::text[]) FOR UPDATE"
FIND_ENTRIES = f"""
SELECT {ENTRY_COLUMNS} FROM (
  SELECT * FROM {{schema}}.operations WHERE seq < :before ORDER BY seq DESC LIMIT :scan) o
WHERE (:actor::text IS NULL OR actor = :actor) AND (:action::text IS NULL OR action = :action)
  AND (:subject::text IS NULL OR o.ids::jsonb ? :subject) AND (:text::text IS NULL OR strpos(note, :text) > 0)
ORDER BY seq DESC LIMIT :limit
"""
REACH = (
    "SELECT count(*), min(seq) FROM (SELECT seq FROM {schema}.operations WHERE seq < :before ORDER BY seq DESC"
    " LIMIT :scan) o"
)
ENTRIES_BY_SEQ = f"SELECT {ENTRY_COLUMNS} FROM {{schema}}.operations WHERE seq = ANY($1::bigint[])"


def entry_of(row: Any) -> OperationEntry:
    """An operator audit entry from its row (``ENTRY_COLUMNS``)."""
    seq, at_ms, actor, role, action, note, filter_json, count, ids_json, digest, outcome_json = tuple(row)
    return OperationEntry(
        seq, at_ms, actor, role, action, note, json.loads(filter_json), count, tuple(json.loads(ids_json)), digest,
        json.loads(outcome_json),
    )  # fmt: skip


async def operate(conn: Connection, schema: str, operation: Operation, now_ms: int, ripple: Ripple) -> OperationEntry:
    """Carry out ``operation`` in the caller's transaction (the module's docstring); its operator audit entry.
    ``ripple`` counts the jobs a cancel's settled graphs released."""
    audited: list[int] = []
    if operation.action in QUEUE_ACTIONS:
        ids, outcome = await _on_queues(conn, schema, operation, now_ms)
        filter_: dict[str, Any] = {"queues": list(operation.queues)}
    elif operation.action in SCHEDULE_ACTIONS:
        ids, outcome, filter_ = await _on_schedules(conn, schema, operation, now_ms)
    else:
        jobs = await _found_again(conn, schema, operation)
        ids = [job.id for job in jobs]
        audited, outcome = await _ACTS[operation.action](conn, schema, operation, jobs, now_ms, ripple)
        filter_ = operation.query.as_dict()
    row = await conn.fetchrow(
        INSERT_ENTRY.format(schema=schema), now_ms, operation.actor, operation.role, operation.action, operation.note,
        json.dumps(filter_), len(ids), json.dumps(ids), operation.digest, json.dumps(outcome),
    )  # fmt: skip
    entry = entry_of(row)
    await conn.execute(NAME_ENTRY.format(schema=schema), entry.seq, audited)
    return entry


Acted = tuple[list[int], dict[str, int]]


async def find_set(conn: Connection, schema: str, action: str, query: JobQuery, lock: bool = False) -> Selection:
    """A job action's set, as its preview and the action itself find it (``ConsoleStore.select``), in the caller's
    transaction; with ``lock``, the rows found are locked (in ``seq`` order) before a delete's are sorted into those
    a graph still needs and the others, and read again as locked."""
    page = await search(conn, schema, selection_plan(action, query), None, MAX_IDS, BULK_SCAN, body=False)
    jobs, capped = page.jobs, page.next is not None
    if lock:
        rows = await conn.fetch(LOCK_SET.format(schema=schema), [job.seq for job in jobs])
        now = {int(row[0]): (str(row[2]), int(row[3])) for row in rows}
        jobs = [replace(job, status=now[job.seq][0], token=now[job.seq][1]) for job in jobs if job.seq in now]
    if action not in SPARES_GRAPHS or not jobs:
        return Selection(jobs, capped)
    needed = {int(row[0]) for row in await conn.fetch(NEEDED.format(schema=schema), [job.seq for job in jobs])}
    return Selection([job for job in jobs if job.seq not in needed], capped, [job for job in jobs if job.seq in needed])


async def _found_again(conn: Connection, schema: str, operation: Operation) -> list[Job]:
    """The action's set found as its preview found it, its rows locked (in ``seq`` order) and checked as locked:
    from here to the commit no other transaction can move a member, so the digest holds for the whole action."""
    jobs = (await find_set(conn, schema, operation.action, operation.query, lock=True)).jobs
    members = [(job.seq, job.id, job.status, job.token) for job in jobs]
    check_same_set(operation.action, operation.count, operation.digest, members)
    return jobs


async def _redrive(conn: Connection, schema: str, op: Operation, jobs: list[Job], now_ms: int, _r: Ripple) -> Acted:
    audited = []
    for job in jobs:  # a key held (UniqueConflict) or a dependency still dead (ValueError): all rolls back
        entry = await transitions.redrive(conn, schema, job.id, now_ms, now_ms + op.ttl_ms, op.note)
        audited.append(int(entry["seq"]))
    return audited, {"redriven": len(jobs)}


async def _cancel(conn: Connection, schema: str, op: Operation, jobs: list[Job], now_ms: int, ripple: Ripple) -> Acted:
    audited: list[int] = []
    outcome = {"cancelled": 0, "requested": 0, "requested before": 0}
    for job in jobs:
        decided, entry, _status = await transitions.cancel(conn, schema, job.id, now_ms, op.note, ripple)
        if decided is CancelState.TOO_LATE:  # the set's rows are locked: only an earlier member's graph ended it
            outcome[ENDED_BY_GRAPH] = outcome.get(ENDED_BY_GRAPH, 0) + 1
            continue
        outcome[decided.value if entry is not None else "requested before"] += 1
        if entry is not None:
            audited.append(int(entry["seq"]))
    return audited, outcome


async def _delete(conn: Connection, schema: str, op: Operation, jobs: list[Job], now_ms: int, _r: Ripple) -> Acted:
    seqs = [job.seq for job in jobs]
    locked = await conn.fetch(LOCK_TO_DELETE.format(schema=schema), seqs)
    if len(locked) != len(jobs):  # one was claimed since it was found
        raise SetChanged(op.count, len(locked))
    audited = await _audit_moves(conn, schema, op, jobs, DELETE, now_ms)
    for statement in DELETE_ROWS:
        await conn.execute(statement.format(schema=schema), seqs)
    return audited, {"deleted": len(jobs)}


async def _priority(conn: Connection, schema: str, op: Operation, jobs: list[Job], now_ms: int, _r: Ripple) -> Acted:
    done = await conn.execute(SET_PRIORITY.format(schema=schema), [job.seq for job in jobs], op.priority)
    if int(done.split()[-1]) != len(jobs):
        raise SetChanged(op.count, int(done.split()[-1]))
    return await _audit_moves(conn, schema, op, jobs, PRIORITY, now_ms), {"changed": len(jobs)}


_ACTS = {REDRIVE: _redrive, CANCEL: _cancel, DELETE: _delete, PRIORITY: _priority}


async def _audit_moves(
    conn: Connection, schema: str, op: Operation, jobs: list[Job], action: str, now: int
) -> list[int]:
    """A job audit row per job (``delete``, ``priority``); their seqs."""
    ids, seqs, tokens = [job.id for job in jobs], [job.seq for job in jobs], [job.token for job in jobs]
    rows = await conn.fetch(AUDIT_MOVES.format(schema=schema), ids, now, op.note, action, seqs, tokens)
    return [int(row[0]) for row in rows]


async def _on_queues(conn: Connection, schema: str, op: Operation, now_ms: int) -> tuple[list[str], dict[str, int]]:
    """A pause or resume of the named queues that are running (paused), each with its queue audit row."""
    found = {row[0]: row[1] for row in await conn.fetch(QUEUE_STATES.format(schema=schema), list(op.queues))}
    members = queue_set(op.action, {queue: found.get(queue) for queue in op.queues})
    check_same_set(op.action, op.count, op.digest, list(members))
    for queue, _at in members:
        try:
            await flow.set_paused(conn, schema, queue, op.action == PAUSE, now_ms, op.note, op.actor)
        except ValueError:  # paused (resumed) by another host since it was read
            raise SetChanged(op.count, op.count - 1) from None
    return [queue for queue, _at in members], {"paused" if op.action == PAUSE else "resumed": len(members)}


async def _on_schedules(
    conn: Connection, schema: str, op: Operation, now_ms: int
) -> tuple[list[str], dict[str, int], dict[str, Any]]:
    """A pause, resume or run now of the named schedules it applies to (their rows locked), each with its schedule
    event; the names, the outcome, and the filter (with the jobs a run now enqueued)."""
    members = schedule_set(op.action, await schedules.named(conn, schema, op.schedules))
    check_same_set(op.action, op.count, op.digest, list(members))
    names = [name for name, _at in members]
    filter_: dict[str, Any] = {"schedules": list(op.schedules)}
    if op.action == RUN_SCHEDULE:
        events = [
            await schedules.run_now(conn, schema, name, now_ms, op.note, op.actor, channel(schema)) for name in names
        ]
        return names, {"enqueued": len(names)}, filter_ | {"jobs": [event.job_id for event in events]}
    pausing = op.action == PAUSE_SCHEDULE
    for name in names:
        await schedules.set_paused(conn, schema, name, pausing, now_ms, op.note, op.actor)
    return names, {"paused" if pausing else "resumed": len(names)}, filter_


async def queue_states(conn: Connection, schema: str, queues: list[str]) -> dict[str, int | None]:
    """Each named queue's ``paused_at`` (``None``: it runs)."""
    found = {
        row[0]: row[1]
        for row in await conn.fetch(QUEUE_STATES.replace(" FOR UPDATE", "").format(schema=schema), queues)
    }
    return {queue: found.get(queue) for queue in queues}


async def find_entries(conn: Connection, schema: str, query: AuditQuery) -> tuple[list[OperationEntry], int | None]:
    """The entries ``query`` finds among the ``scan`` newest before ``before``, and where to go on from when the
    scan was cut short (``None``: it reached the oldest)."""
    params: dict[str, Any] = {"before": query.before or 2**62, "scan": query.scan, "limit": query.limit}
    params |= {"actor": query.actor, "action": query.action, "subject": query.subject, "text": query.text}
    rows = await conn.fetch(*_args(FIND_ENTRIES.format(schema=schema), params))
    entries = [entry_of(row) for row in rows]
    if len(entries) == query.limit:
        return entries, entries[-1].seq
    reach = await conn.fetchrow(*_args(REACH.format(schema=schema), params))
    assert reach is not None
    return entries, reach[1] if reach[0] >= query.scan else None


async def entries_by_seq(conn: Connection, schema: str, seqs: list[int]) -> dict[int, OperationEntry]:
    """The entries of these seqs, by seq."""
    entries = (entry_of(row) for row in await conn.fetch(ENTRIES_BY_SEQ.format(schema=schema), seqs))
    return {entry.seq: entry for entry in entries}


def _args(statement: str, params: dict[str, Any]) -> list[Any]:
    text, values = numbered(statement, params)
    return [text, *values]
