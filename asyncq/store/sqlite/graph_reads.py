"""The SQLite driver's reads of groups and of what jobs wait for (``asyncq groups``, ``asyncq jobs --waiting``, the
dashboard, the metrics), each in one read transaction of the connection's thread."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence
from typing import Any

from asyncq.core.dependencies import DependencyState, WaitsFor
from asyncq.core.groups import Group, group_callback_id
from asyncq.core.jobs import Job
from asyncq.store.port.graphs import GroupFilter
from asyncq.store.sqlite.admin import JOB_COLUMNS, JOB_EXTRAS, _job, snapshot

_GROUP = """SELECT g.name, g.members, g.done, g.dead, g.created_at, g.sealed_at, g.completed_at, g.callback_seq,
  c.status FROM asyncq_groups g LEFT JOIN asyncq_jobs c ON c.seq = g.callback_seq"""
GROUP = f"{_GROUP} WHERE g.name = ?"
GROUPS = f"""{_GROUP} WHERE g.name > :after AND (NOT :open OR g.completed_at IS NULL) ORDER BY g.name LIMIT :limit"""
OPEN_GROUPS = "SELECT count(*) FROM asyncq_groups WHERE completed_at IS NULL"
MEMBERS = f"""SELECT {JOB_COLUMNS}, {JOB_EXTRAS} FROM asyncq_jobs j INDEXED BY asyncq_jobs_members
WHERE group_name IS NOT NULL AND group_name = :name AND (:status IS NULL OR status = :status) AND seq > :after
ORDER BY seq LIMIT :limit"""
_IDS = "(SELECT value FROM json_each(:ids))"
EDGES_OF = f"""SELECT j.id, d.id, d.status, e.policy, e.state FROM asyncq_jobs j
JOIN asyncq_edges e ON e.dependant = j.seq JOIN asyncq_jobs d ON d.seq = e.dependency
WHERE j.id IN {_IDS} ORDER BY j.id, e.dependency"""
DEPENDANTS_OF = """SELECT d.id, d.status, e.policy, e.state FROM asyncq_jobs j
JOIN asyncq_edges e ON e.dependency = j.seq JOIN asyncq_jobs d ON d.seq = e.dependant
WHERE j.id = :id ORDER BY e.dependant LIMIT :limit"""
CALLBACKS_OF = (
    f"SELECT j.id, g.name FROM asyncq_jobs j JOIN asyncq_groups g ON g.callback_seq = j.seq WHERE j.id IN {_IDS}"
)
EXISTING = f"SELECT id FROM asyncq_jobs WHERE id IN {_IDS}"


def _group(row: Sequence[Any]) -> Group:
    name, members, done, dead, created_at, sealed_at, completed_at, callback_seq, callback_status = row
    callback = None if callback_seq is None else group_callback_id(name)
    return Group(name, members, done, dead, created_at, sealed_at, completed_at, callback, callback_status)


def group(con: sqlite3.Connection, name: str) -> Group | None:
    """One group, or ``None``."""
    row = con.execute(GROUP, (name,)).fetchone()
    return None if row is None else _group(row)


def groups(con: sqlite3.Connection, which: GroupFilter) -> list[Group]:
    """Groups by name after ``which.after`` (only those not complete, with ``open_only``)."""
    params = {"after": which.after, "open": which.open_only, "limit": which.limit}
    return [_group(row) for row in con.execute(GROUPS, params)]


def open_groups(con: sqlite3.Connection) -> int:
    """How many groups are not complete."""
    return int(con.execute(OPEN_GROUPS).fetchone()[0])


def group_members(con: sqlite3.Connection, name: str, status: str | None, after: int, limit: int) -> list[Job]:
    """A group's members (in ``status`` if named) past ``seq = after``, without their bodies."""
    params = {"name": name, "status": status, "after": after, "limit": limit}
    return [_job(row, body=False) for row in con.execute(MEMBERS, params)]


def waits_for(con: sqlite3.Connection, job_ids: Sequence[str]) -> dict[str, WaitsFor]:
    """What each existing job of ``job_ids`` waits for (one snapshot)."""
    ids = {"ids": json.dumps(list(dict.fromkeys(job_ids)))}
    with snapshot(con):
        existing = [job_id for (job_id,) in con.execute(EXISTING, ids)]
        edges = con.execute(EDGES_OF, ids).fetchall()
        callbacks = dict(con.execute(CALLBACKS_OF, ids).fetchall())
    found: dict[str, list[DependencyState]] = {job_id: [] for job_id in existing}
    for job_id, dependency, status, policy, state in edges:
        found[job_id].append(DependencyState(dependency, status, policy, state))
    return {job_id: WaitsFor(job_id, tuple(each), callbacks.get(job_id)) for job_id, each in found.items()}


def dependants(con: sqlite3.Connection, job_id: str, limit: int) -> list[DependencyState]:
    """The jobs that depend on ``job_id`` (at most ``limit``, oldest first), each as its edge stands."""
    with snapshot(con):
        rows = con.execute(DEPENDANTS_OF, {"id": job_id, "limit": limit}).fetchall()
    return [DependencyState(*row) for row in rows]
