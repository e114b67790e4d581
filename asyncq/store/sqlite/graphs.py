"""The SQLite driver's dependencies and groups: statements by name, run inside the write transaction the caller
holds (the engine's), so that a dependency's end moves its dependants and its group in the same transaction as
the finish, sweep or cancel that ended it. Every decision is ``core.dependencies``' or ``core.groups``'; these
functions read rows, run the plans' statements and say what moved.

Only jobs in a graph pay: the engine calls ``settle_ends`` for the rows whose ``links`` its statements returned,
and ``enqueue_linked`` for a batch with dependencies or a group.
"""

from __future__ import annotations

import json
import sqlite3
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from asyncq.core.dependencies import (
    FAILED,
    HAS_DEPENDANTS,
    IN_GROUP,
    IS_CALLBACK,
    MET,
    Rearm,
    Ripple,
    check_batch,
    order_batch,
    plan_arrival,
    plan_ends,
    plan_redrive,
)
from asyncq.core.groups import GroupOutcome, callback_body
from asyncq.core.jobs import Enqueued, NewJob, decode_stored
from asyncq.core.lifecycle import DEAD, PENDING, WAITING
from asyncq.errors import Conflict

_IN = "(SELECT value FROM json_each(:seqs))"
ID_SEQ_STATUS = "SELECT id, seq, status FROM asyncq_jobs WHERE id IN (SELECT value FROM json_each(:ids))"
SEALED_AMONG = (
    "SELECT name FROM asyncq_groups WHERE name IN (SELECT value FROM json_each(:names)) AND sealed_at IS NOT NULL"
)
INSERT_EDGE = "INSERT OR IGNORE INTO asyncq_edges (dependency, dependant, policy, state) VALUES (?, ?, ?, ?)"
# A new job's place once its edges are read: waiting (its count of edges not met), or dead (a dependency had ended
# dead under policy ``dead``; its enqueue is its end).
ARRIVE_WAITING = "UPDATE asyncq_jobs SET status = 'waiting', waits = ? WHERE seq = ?"
ARRIVE_DEAD = "UPDATE asyncq_jobs SET status = 'dead', reason = 'dependency', waits = ?, available_at = ? WHERE seq = ?"
MARK = f"UPDATE asyncq_jobs SET links = ifnull(links, 0) | :flag WHERE seq IN {_IN}"
JOIN_GROUP = """INSERT INTO asyncq_groups (name, members, dead, created_at) VALUES (?, ?, ?, ?)
ON CONFLICT (name) DO UPDATE SET members = members + excluded.members, dead = dead + excluded.dead"""
OPEN_EDGES_OF = f"SELECT dependency, dependant, policy FROM asyncq_edges WHERE dependency IN {_IN} AND state = 'open'"
SET_EDGE = "UPDATE asyncq_edges SET state = ? WHERE dependency = ? AND dependant = ?"
# Each dependant's count drops by the edges met now (``:pairs``: ``[seq, n]`` each), whatever its status (a redrive
# reads it); a waiting one that reaches 0 goes pending, ready at its own ``available_at`` or now if that has passed.
MEET = """
UPDATE asyncq_jobs SET waits = waits - v.n,
  status = CASE WHEN status = 'waiting' AND waits - v.n <= 0 THEN 'pending' ELSE status END,
  available_at = CASE WHEN status = 'waiting' AND waits - v.n <= 0 THEN max(available_at, :now) ELSE available_at END
FROM (SELECT json_extract(value, '$[0]') AS seq, json_extract(value, '$[1]') AS n FROM json_each(:pairs)) AS v
WHERE asyncq_jobs.seq = v.seq
RETURNING asyncq_jobs.status
"""
KILL = f"""
UPDATE asyncq_jobs SET status = 'dead', reason = 'dependency', available_at = :now
WHERE seq IN {_IN} AND status = 'waiting'
RETURNING seq, links
"""
GROUPS_OF = f"SELECT seq, group_name FROM asyncq_jobs WHERE seq IN {_IN} AND group_name IS NOT NULL"
COUNT_ENDS = "UPDATE asyncq_groups SET done = done + ?, dead = dead + ? WHERE name = ? AND completed_at IS NULL"
# The completion, once: a compare-and-set on ``completed_at`` with ``core.groups.is_complete``'s condition.
COMPLETE = """
UPDATE asyncq_groups SET completed_at = :now
WHERE name = :name AND completed_at IS NULL AND sealed_at IS NOT NULL AND done + dead >= members
RETURNING members, done, dead, callback_seq
"""
BODY_OF = "SELECT body FROM asyncq_jobs WHERE seq = ?"
# The callback's wait for its group ends: its body gets the outcome; a waiting one goes pending (one that ended while
# it waited, at its deadline or cancelled, keeps its status and runs only if an operator redrives it).
RELEASE_CALLBACK = """
UPDATE asyncq_jobs SET body = :body, waits = max(waits - 1, 0),
  status = CASE WHEN status = 'waiting' AND waits <= 1 THEN 'pending' ELSE status END,
  available_at = CASE WHEN status = 'waiting' AND waits <= 1 THEN max(available_at, :now) ELSE available_at END
WHERE seq = :seq
RETURNING status
"""
SEALED_AT = "SELECT sealed_at FROM asyncq_groups WHERE name = ?"
SEAL = """INSERT INTO asyncq_groups (name, created_at, sealed_at, callback_seq) VALUES (:name, :now, :now, :callback)
ON CONFLICT (name) DO UPDATE SET sealed_at = excluded.sealed_at, callback_seq = excluded.callback_seq"""
AWAIT_GROUP = f"UPDATE asyncq_jobs SET status = 'waiting', waits = 1, links = {IS_CALLBACK} WHERE seq = ?"
GRAPH_OF = "SELECT waits, group_name FROM asyncq_jobs WHERE seq = ?"
EDGES_NOT_MET = """
SELECT e.dependency, d.id, e.policy, e.state, d.status FROM asyncq_edges e
LEFT JOIN asyncq_jobs d ON d.seq = e.dependency WHERE e.dependant = ? AND e.state <> 'met'
"""
AWAITS_GROUP = "SELECT 1 FROM asyncq_groups WHERE callback_seq = ? AND completed_at IS NULL"
REARM = """
UPDATE asyncq_jobs SET waits = :waits, status = CASE WHEN :waits > 0 THEN 'waiting' ELSE status END WHERE seq = :seq
"""
REOPEN = "UPDATE asyncq_edges SET state = 'open' WHERE dependant = ? AND state = 'failed'"
UNCOUNT_DEAD = "UPDATE asyncq_groups SET dead = dead - 1 WHERE name = ? AND completed_at IS NULL"

#: ``(seq, status it ended in, links)`` of a job in a graph that just ended.
End = tuple[int, str, int]


def _json(values: Iterable[Any]) -> str:
    return json.dumps(list(values))


# -- enqueue -------------------------------------------------------------------------------------------------


def enqueue_linked(
    con: sqlite3.Connection, jobs: Sequence[NewJob], insert: Callable[[Sequence[NewJob]], list[Enqueued]]
) -> list[Enqueued]:
    """Insert a batch in which some jobs have dependencies or a group (``insert`` inserts the rows as any batch),
    then store each new job's edges, its place (``core.dependencies.plan_arrival``) and its group's count, inside the
    caller's transaction. Refused before any statement writes (``ValueError``): a dependency neither in the batch nor
    stored, a group sealed already; after the insert, a cycle through jobs that stand for others (unique keys)."""
    batch = {job.id for job in jobs}
    outside = sorted({dep for job in jobs for dep, _policy in job.after} - batch)
    stored = _id_seq_status(con, outside)
    unknown = [dep for dep in outside if dep not in stored]
    if unknown:
        raise ValueError(f"after names jobs that do not exist: {', '.join(map(repr, unknown[:5]))}")
    names = sorted({job.payload["group_name"] for job in jobs if job.payload["group_name"] is not None})
    sealed = [name for (name,) in con.execute(SEALED_AMONG, {"names": _json(names)})] if names else []
    if sealed:
        raise ValueError(f"group {sealed[0]!r} is sealed: it takes no new member")
    added = insert(jobs)
    standing = {job.id: answer if isinstance(answer, str) else job.id for job, answer in zip(jobs, added, strict=True)}
    new = [job for job, answer in zip(jobs, added, strict=True) if answer is True]
    if new:
        _arrive(con, new, standing)
    return added


def _id_seq_status(con: sqlite3.Connection, ids: Iterable[str]) -> dict[str, tuple[int, str]]:
    found = con.execute(ID_SEQ_STATUS, {"ids": _json(ids)}).fetchall()
    return {job_id: (seq, status) for job_id, seq, status in found}


def _arrive(con: sqlite3.Connection, new: Sequence[NewJob], standing: dict[str, str]) -> None:
    """Edges, places and group counts of the jobs just inserted (``new``), dependencies resolved to the jobs that
    stand for them (``standing``: a batch job not inserted stands for the job holding its id or unique key)."""
    resolved = [(job.id, [(standing.get(dep, dep), policy) for dep, policy in job.after]) for job in new]
    check_batch(resolved)
    rows = _id_seq_status(con, {job.id for job in new} | {dep for _id, after in resolved for dep, _p in after})
    planned: dict[str, str] = {}
    by_id = dict(resolved)
    by_job = {job.id: job for job in new}
    for job_id in order_batch(resolved):
        if not by_id[job_id]:
            continue
        edges = [(rows[dep][0], policy, planned.get(dep, rows[dep][1])) for dep, policy in by_id[job_id]]
        arrival = plan_arrival(edges)
        seq = rows[job_id][0]
        planned[job_id] = arrival.status
        con.executemany(INSERT_EDGE, [(dependency, seq, policy, state) for dependency, policy, state in arrival.edges])
        if arrival.status == WAITING:
            con.execute(ARRIVE_WAITING, (arrival.waits, seq))
        elif arrival.status == DEAD:
            con.execute(ARRIVE_DEAD, (arrival.waits, by_job[job_id].enqueued_at, seq))
    dependencies = {rows[dep][0] for _id, after in resolved for dep, _policy in after}
    if dependencies:
        con.execute(MARK, {"flag": HAS_DEPENDANTS, "seqs": _json(sorted(dependencies))})
    _join_groups(con, new, rows, planned)


def _join_groups(
    con: sqlite3.Connection, new: Sequence[NewJob], rows: dict[str, tuple[int, str]], planned: dict[str, str]
) -> None:
    """Count the new members of each group (those that arrived dead as dead) and flag them ``IN_GROUP``."""
    members = [job for job in new if job.payload["group_name"] is not None]
    if not members:
        return
    counts: Counter[str] = Counter(job.payload["group_name"] for job in members)
    dead: Counter[str] = Counter(job.payload["group_name"] for job in members if planned.get(job.id) == DEAD)
    now = max(job.enqueued_at for job in members)
    for name in sorted(counts):  # a member that arrives dead counts dead: the group is not sealed, none completes
        con.execute(JOIN_GROUP, (name, counts[name], dead[name], now))
    con.execute(MARK, {"flag": IN_GROUP, "seqs": _json(sorted(rows[job.id][0] for job in members))})


# -- ends ----------------------------------------------------------------------------------------------------


def settle_ends(con: sqlite3.Connection, ends: Sequence[End], now_ms: int, ripple: Ripple) -> None:
    """Settle what ``ends`` (jobs in a graph that just ended, with their ``links``) do: their dependants' edges
    (met, failed), counts, releases and kills, then their groups' counters and completions; a dependant killed
    ends in turn, until nothing more moves (a graph has no cycle, so this stops)."""
    while ends:
        dependencies = {seq: status for seq, status, links in ends if links & HAS_DEPENDANTS}
        members = [(seq, status) for seq, status, links in ends if links & IN_GROUP]
        killed: list[End] = []
        if dependencies:
            killed = _settle_dependants(con, dependencies, now_ms, ripple)
        if members:
            _count_members(con, members, now_ms, ripple)
        ends = killed


def _settle_dependants(con: sqlite3.Connection, ends: dict[int, str], now_ms: int, ripple: Ripple) -> list[End]:
    edges = con.execute(OPEN_EDGES_OF, {"seqs": _json(sorted(ends))}).fetchall()
    if not edges:
        return []
    plan = plan_ends(ends, edges)
    con.executemany(SET_EDGE, [(MET, *edge) for edge in plan.met] + [(FAILED, *edge) for edge in plan.failed])
    if plan.decrements:
        moved = con.execute(MEET, {"pairs": _json(plan.decrements), "now": now_ms}).fetchall()
        ripple.released += sum(status == PENDING for (status,) in moved)
    if not plan.kills:
        return []
    killed = con.execute(KILL, {"seqs": _json(plan.kills), "now": now_ms}).fetchall()
    return [(seq, DEAD, links) for seq, links in killed if links]


def _count_members(con: sqlite3.Connection, ends: Sequence[tuple[int, str]], now_ms: int, ripple: Ripple) -> None:
    status_of = dict(ends)
    groups = con.execute(GROUPS_OF, {"seqs": _json(sorted(status_of))}).fetchall()
    done: Counter[str] = Counter(name for seq, name in groups if status_of[seq] != DEAD)
    dead: Counter[str] = Counter(name for seq, name in groups if status_of[seq] == DEAD)
    names = sorted({name for _seq, name in groups})
    for name in names:
        con.execute(COUNT_ENDS, (done[name], dead[name], name))
    complete_groups(con, names, now_ms, ripple)


def complete_groups(con: sqlite3.Connection, names: Iterable[str], now_ms: int, ripple: Ripple) -> None:
    """Complete each group of ``names`` that is sealed with every member ended (at most once: the compare-and-set
    on ``completed_at``), and release its callback with the outcome in its body."""
    for name in names:
        row = con.execute(COMPLETE, {"now": now_ms, "name": name}).fetchone()
        if row is None or row[3] is None:
            continue
        members, done, dead, callback_seq = row
        found = con.execute(BODY_OF, (callback_seq,)).fetchone()
        if found is None:  # the callback was cancelled and pruned before its group completed
            continue
        body = callback_body(decode_stored(found[0]), GroupOutcome(name, members, done, dead))
        (status,) = con.execute(RELEASE_CALLBACK, {"body": body, "now": now_ms, "seq": callback_seq}).fetchone()
        ripple.released += status == PENDING


def seal(
    con: sqlite3.Connection,
    name: str,
    callback: NewJob | None,
    now_ms: int,
    insert: Callable[[Sequence[NewJob]], list[Enqueued]],
    ripple: Ripple,
) -> bool:
    """Seal ``name`` (created if no member joined yet) with its callback stored waiting for it, and complete it if
    every member has ended already; ``False`` (nothing changes) if it was sealed before. ``Conflict`` if the
    callback's id is taken by another job."""
    row = con.execute(SEALED_AT, (name,)).fetchone()
    if row is not None and row[0] is not None:
        return False
    callback_seq = None
    if callback is not None:
        taken = Conflict(f"the id {callback.id!r} of group {name!r}'s callback is taken by another job")
        try:
            if insert([callback]) != [True]:
                raise taken
        except Conflict:
            raise taken from None
        callback_seq = _id_seq_status(con, [callback.id])[callback.id][0]
        con.execute(AWAIT_GROUP, (callback_seq,))
    con.execute(SEAL, {"name": name, "now": now_ms, "callback": callback_seq})
    complete_groups(con, [name], now_ms, ripple)
    return True


# -- operators -----------------------------------------------------------------------------------------------


def plan_rearm(con: sqlite3.Connection, seq: int, job_id: str) -> tuple[Rearm | None, str | None]:
    """Before a dead job's redrive changes anything: its edges not met evaluated again (``ValueError`` if one would
    fail at once), or ``None`` if it waits for nothing; and its group, if any."""
    waits, group = con.execute(GRAPH_OF, (seq,)).fetchone()
    if not waits:
        return None, group
    edges = [
        (dependency, dep_id or "?", policy, state, status)
        for dependency, dep_id, policy, state, status in con.execute(EDGES_NOT_MET, (seq,))
    ]
    awaits_group = con.execute(AWAITS_GROUP, (seq,)).fetchone() is not None
    return plan_redrive(job_id, edges, awaits_group), group


def rearm(con: sqlite3.Connection, seq: int, plan: Rearm | None, group: str | None) -> None:
    """After the redrive's own statement (dead -> pending): its edges met now, the others open again, and
    ``waiting`` while any is not met; a member of a group not complete is no longer counted dead."""
    if plan is not None:
        con.executemany(SET_EDGE, [(MET, dependency, seq) for dependency in plan.met])
        con.execute(REOPEN, (seq,))
        con.execute(REARM, {"waits": plan.waits, "seq": seq})
    if group is not None:
        con.execute(UNCOUNT_DEAD, (group,))
