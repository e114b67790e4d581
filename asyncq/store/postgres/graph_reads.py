"""The PostgreSQL driver's reads of groups and of what jobs wait for (the SQLite driver's ``graph_reads``), each
inside the caller's read snapshot."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from asyncq.core.dependencies import DependencyState, WaitsFor
from asyncq.core.groups import Group, group_callback_id
from asyncq.core.jobs import Job
from asyncq.store.port.graphs import GroupFilter
from asyncq.store.postgres.admin import JOB_COLUMNS, JOB_EXTRAS, _job, q
from asyncq.store.postgres.connection import Connection

_GROUP = """SELECT g.name, g.members, g.done, g.dead, g.created_at, g.sealed_at, g.completed_at, g.callback_seq,
  c.status FROM {schema}.groups g LEFT JOIN {schema}.jobs c ON c.seq = g.callback_seq"""
GROUP = f"{_GROUP} WHERE g.name = $1"
GROUPS = f"""{_GROUP} WHERE g.name COLLATE "C" > $1 AND (NOT $2 OR g.completed_at IS NULL)
ORDER BY g.name COLLATE "C" LIMIT $3"""
OPEN_GROUPS = "SELECT count(*) FROM {schema}.groups WHERE completed_at IS NULL"
MEMBERS = f"""SELECT {JOB_COLUMNS}, {JOB_EXTRAS} FROM {{schema}}.jobs j
WHERE group_name IS NOT NULL AND group_name = $1 AND ($2::text IS NULL OR status = $2) AND seq > $3
ORDER BY seq LIMIT $4"""
EDGES_OF = """SELECT j.id, d.id, d.status, e.policy, e.state FROM {schema}.jobs j
JOIN {schema}.edges e ON e.dependant = j.seq JOIN {schema}.jobs d ON d.seq = e.dependency
WHERE j.id = ANY($1::text[]) ORDER BY j.id, e.dependency"""
DEPENDANTS_OF = """SELECT d.id, d.status, e.policy, e.state FROM {schema}.jobs j
JOIN {schema}.edges e ON e.dependency = j.seq JOIN {schema}.jobs d ON d.seq = e.dependant
WHERE j.id = $1 ORDER BY e.dependant LIMIT $2"""
CALLBACKS_OF = """SELECT j.id, g.name FROM {schema}.jobs j JOIN {schema}.groups g ON g.callback_seq = j.seq
WHERE j.id = ANY($1::text[])"""
EXISTING = "SELECT id FROM {schema}.jobs WHERE id = ANY($1::text[])"


def _group(row: Sequence[Any]) -> Group:
    name, members, done, dead, created_at, sealed_at, completed_at, callback_seq, callback_status = row
    callback = None if callback_seq is None else group_callback_id(name)
    return Group(name, members, done, dead, created_at, sealed_at, completed_at, callback, callback_status)


async def group(conn: Connection, schema: str, name: str) -> Group | None:
    """One group, or ``None``."""
    row = await conn.fetchrow(q(GROUP, schema), name)
    return None if row is None else _group(tuple(row))


async def groups(conn: Connection, schema: str, which: GroupFilter) -> list[Group]:
    """Groups by name (code-point order, as SQLite's) after ``which.after``."""
    rows = await conn.fetch(q(GROUPS, schema), which.after, which.open_only, which.limit)
    return [_group(tuple(row)) for row in rows]


async def open_groups(conn: Connection, schema: str) -> int:
    """How many groups are not complete."""
    return int(await conn.fetchval(q(OPEN_GROUPS, schema)))


async def group_members(
    conn: Connection, schema: str, name: str, status: str | None, after: int, limit: int
) -> list[Job]:
    """A group's members (in ``status`` if named) past ``seq = after``, without their bodies."""
    rows = await conn.fetch(q(MEMBERS, schema), name, status, after, limit)
    return [_job(row, body=False) for row in rows]


async def waits_for(conn: Connection, schema: str, job_ids: Sequence[str]) -> dict[str, WaitsFor]:
    """What each existing job of ``job_ids`` waits for."""
    ids = list(dict.fromkeys(job_ids))
    existing = [row[0] for row in await conn.fetch(q(EXISTING, schema), ids)]
    edges = await conn.fetch(q(EDGES_OF, schema), ids)
    callbacks = {row[0]: row[1] for row in await conn.fetch(q(CALLBACKS_OF, schema), ids)}
    found: dict[str, list[DependencyState]] = {job_id: [] for job_id in existing}
    for job_id, dependency, status, policy, state in edges:
        found[job_id].append(DependencyState(dependency, status, policy, state))
    return {job_id: WaitsFor(job_id, tuple(each), callbacks.get(job_id)) for job_id, each in found.items()}


async def dependants(conn: Connection, schema: str, job_id: str, limit: int) -> list[DependencyState]:
    """The jobs that depend on ``job_id`` (at most ``limit``, oldest first), each as its edge stands."""
    return [DependencyState(*row) for row in await conn.fetch(q(DEPENDANTS_OF, schema), job_id, limit)]
