"""The PostgreSQL driver's dependencies and groups (the SQLite driver's ``graphs``, statement for statement): run
inside the transaction the caller holds, so that a dependency's end moves its dependants and its group in the same
transaction as the finish, sweep or cancel that ended it. Every decision is ``core.dependencies``' or
``core.groups``'.

Concurrency (``READ COMMITTED``): the rows an end updates (its dependants, its group) are taken in ascending order
(seq, name), and every count is read and compared under the row's own lock, so two transactions ending the last two
dependencies of a job, or the last two members of a group, release it once. An enqueue locks the stored jobs its
new jobs wait for (``FOR NO KEY UPDATE``, the lock a finish takes): a finish of one of them waits for that
transaction and then sees its edges, or ended first and the enqueue reads its end.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Sequence

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
from asyncq.core.lifecycle import DEAD, PENDING
from asyncq.errors import Conflict
from asyncq.store.postgres.connection import Connection
from asyncq.store.postgres.statements import NOTIFY, channel

LOCK_IDS = "SELECT id, seq, status FROM {schema}.jobs WHERE id = ANY($1::text[]) ORDER BY seq FOR NO KEY UPDATE"
ID_SEQ_STATUS = "SELECT id, seq, status FROM {schema}.jobs WHERE id = ANY($1::text[])"
SEALED_AMONG = "SELECT name FROM {schema}.groups WHERE name = ANY($1::text[]) AND sealed_at IS NOT NULL"
INSERT_EDGES = """
INSERT INTO {schema}.edges (dependency, dependant, policy, state)
SELECT * FROM unnest($1::bigint[], $2::bigint[], $3::text[], $4::text[]) ON CONFLICT DO NOTHING
"""
ARRIVE = """
UPDATE {schema}.jobs j SET status = v.status, waits = v.waits,
  reason = CASE WHEN v.status = 'dead' THEN 'dependency' ELSE j.reason END,
  available_at = CASE WHEN v.status = 'dead' THEN v.at ELSE j.available_at END
FROM unnest($1::bigint[], $2::text[], $3::integer[], $4::bigint[]) AS v(seq, status, waits, at) WHERE j.seq = v.seq
"""
MARK = "UPDATE {schema}.jobs SET links = coalesce(links, 0) | $2 WHERE seq = ANY($1::bigint[])"
# A group's new members (and those that arrived dead) counted; a group sealed meanwhile returns no row.
JOIN_GROUPS = """
INSERT INTO {schema}.groups AS g (name, members, dead, created_at)
SELECT * FROM unnest($1::text[], $2::bigint[], $3::bigint[], $4::bigint[])
ON CONFLICT (name) DO UPDATE SET members = g.members + EXCLUDED.members, dead = g.dead + EXCLUDED.dead
WHERE g.sealed_at IS NULL
RETURNING name
"""
OPEN_EDGES_OF = "SELECT dependency, dependant, policy FROM {schema}.edges WHERE dependency = ANY($1) AND state = 'open'"
SET_EDGES = """
UPDATE {schema}.edges e SET state = v.state
FROM unnest($1::bigint[], $2::bigint[], $3::text[]) AS v(dependency, dependant, state)
WHERE e.dependency = v.dependency AND e.dependant = v.dependant
"""
# Each dependant's count drops by the edges met now, whatever its status; a waiting one reaching 0 goes pending.
MEET = """
UPDATE {schema}.jobs j SET waits = j.waits - v.n,
  status = CASE WHEN j.status = 'waiting' AND j.waits - v.n <= 0 THEN 'pending' ELSE j.status END,
  available_at = CASE WHEN j.status = 'waiting' AND j.waits - v.n <= 0 THEN greatest(j.available_at, $3)
                      ELSE j.available_at END
FROM unnest($1::bigint[], $2::integer[]) AS v(seq, n) WHERE j.seq = v.seq
RETURNING j.status
"""
KILL = """
UPDATE {schema}.jobs SET status = 'dead', reason = 'dependency', available_at = $2
WHERE seq = ANY($1::bigint[]) AND status = 'waiting'
RETURNING seq, links
"""
GROUPS_OF = "SELECT seq, group_name FROM {schema}.jobs WHERE seq = ANY($1::bigint[]) AND group_name IS NOT NULL"
COUNT_ENDS = "UPDATE {schema}.groups SET done = done + $2, dead = dead + $3 WHERE name = $1 AND completed_at IS NULL"
COMPLETE = """
UPDATE {schema}.groups SET completed_at = $2
WHERE name = $1 AND completed_at IS NULL AND sealed_at IS NOT NULL AND done + dead >= members
RETURNING members, done, dead, callback_seq
"""
BODY_OF = "SELECT body FROM {schema}.jobs WHERE seq = $1"
RELEASE_CALLBACK = """
UPDATE {schema}.jobs SET body = $2, waits = greatest(waits - 1, 0),
  status = CASE WHEN status = 'waiting' AND waits <= 1 THEN 'pending' ELSE status END,
  available_at = CASE WHEN status = 'waiting' AND waits <= 1 THEN greatest(available_at, $3) ELSE available_at END
WHERE seq = $1
RETURNING status
"""
# A seal takes the group's row lock first (creating the row if no member made it), so racing seals queue on it.
ENSURE_GROUP = "INSERT INTO {schema}.groups (name, created_at) VALUES ($1, $2) ON CONFLICT (name) DO NOTHING"
LOCK_GROUP = "SELECT sealed_at FROM {schema}.groups WHERE name = $1 FOR UPDATE"
SEAL = "UPDATE {schema}.groups SET sealed_at = $2, callback_seq = $3 WHERE name = $1"
AWAIT_GROUP = f"UPDATE {{schema}}.jobs SET status = 'waiting', waits = 1, links = {IS_CALLBACK} WHERE seq = $1"
GRAPH_OF = "SELECT waits, group_name FROM {schema}.jobs WHERE seq = $1"
EDGES_NOT_MET = """
SELECT e.dependency, d.id, e.policy, e.state, d.status FROM {schema}.edges e
LEFT JOIN {schema}.jobs d ON d.seq = e.dependency WHERE e.dependant = $1 AND e.state <> 'met'
"""
AWAITS_GROUP = "SELECT 1 FROM {schema}.groups WHERE callback_seq = $1 AND completed_at IS NULL"
REARM = """
UPDATE {schema}.jobs SET waits = $2, status = CASE WHEN $2 > 0 THEN 'waiting' ELSE status END WHERE seq = $1
"""
REOPEN = "UPDATE {schema}.edges SET state = 'open' WHERE dependant = $1 AND state = 'failed'"
UNCOUNT_DEAD = "UPDATE {schema}.groups SET dead = dead - 1 WHERE name = $1 AND completed_at IS NULL"

#: ``(seq, status it ended in, links)`` of a job in a graph that just ended.
End = tuple[int, str, int]
Insert = Callable[[Sequence[NewJob]], Awaitable[list[Enqueued]]]


def _q(statement: str, schema: str) -> str:
    return statement.format(schema=schema)


async def _id_seq_status(
    conn: Connection, schema: str, ids: Iterable[str], lock: bool = False
) -> dict[str, tuple[int, str]]:
    rows = await conn.fetch(_q(LOCK_IDS if lock else ID_SEQ_STATUS, schema), sorted(set(ids)))
    return {str(job_id): (int(seq), str(status)) for job_id, seq, status in rows}


# -- enqueue -------------------------------------------------------------------------------------------------


async def enqueue_linked(conn: Connection, schema: str, jobs: Sequence[NewJob], insert: Insert) -> list[Enqueued]:
    """Insert a batch with dependencies or a group (``insert`` inserts the rows as any batch), then its edges,
    places and group counts, in the caller's transaction (a savepoint in an app's); ``ValueError`` for a dependency
    neither in the batch nor stored, or a group sealed, found before the insert."""
    batch = {job.id for job in jobs}
    outside = sorted({dep for job in jobs for dep, _policy in job.after} - batch)
    stored = await _id_seq_status(conn, schema, outside, lock=True)
    unknown = [dep for dep in outside if dep not in stored]
    if unknown:
        raise ValueError(f"after names jobs that do not exist: {', '.join(map(repr, unknown[:5]))}")
    names = sorted({job.payload["group_name"] for job in jobs if job.payload["group_name"] is not None})
    sealed = [row[0] for row in await conn.fetch(_q(SEALED_AMONG, schema), names)] if names else []
    if sealed:
        raise ValueError(f"group {sealed[0]!r} is sealed: it takes no new member")
    added = await insert(jobs)
    standing = {job.id: answer if isinstance(answer, str) else job.id for job, answer in zip(jobs, added, strict=True)}
    new = [job for job, answer in zip(jobs, added, strict=True) if answer is True]
    if new:
        await _arrive(conn, schema, new, standing)
    return added


async def _arrive(conn: Connection, schema: str, new: Sequence[NewJob], standing: dict[str, str]) -> None:
    resolved = [(job.id, [(standing.get(dep, dep), policy) for dep, policy in job.after]) for job in new]
    check_batch(resolved)
    needed = {job.id for job in new} | {dep for _id, after in resolved for dep, _p in after}
    rows = await _id_seq_status(conn, schema, needed, lock=True)
    planned: dict[str, str] = {}
    by_id = dict(resolved)
    edges: list[tuple[int, int, str, str]] = []
    places: list[tuple[int, str, int, int]] = []
    enqueued_at = {job.id: job.enqueued_at for job in new}
    for job_id in order_batch(resolved):
        if not by_id[job_id]:
            continue
        arrival = plan_arrival(
            [(rows[dep][0], policy, planned.get(dep, rows[dep][1])) for dep, policy in by_id[job_id]]
        )
        planned[job_id] = arrival.status
        seq = rows[job_id][0]
        edges += [(dependency, seq, policy, state) for dependency, policy, state in arrival.edges]
        if arrival.status != PENDING:
            places.append((seq, arrival.status, arrival.waits, enqueued_at[job_id]))
    if edges:
        await conn.execute(_q(INSERT_EDGES, schema), *map(list, zip(*edges, strict=True)))
        await conn.execute(_q(MARK, schema), sorted({edge[0] for edge in edges}), HAS_DEPENDANTS)
    if places:
        await conn.execute(_q(ARRIVE, schema), *map(list, zip(*places, strict=True)))
    await _join_groups(conn, schema, new, rows, planned)


async def _join_groups(
    conn: Connection, schema: str, new: Sequence[NewJob], rows: dict[str, tuple[int, str]], planned: dict[str, str]
) -> None:
    members = [job for job in new if job.payload["group_name"] is not None]
    if not members:
        return
    counts: Counter[str] = Counter(job.payload["group_name"] for job in members)
    dead: Counter[str] = Counter(job.payload["group_name"] for job in members if planned.get(job.id) == DEAD)
    now = max(job.enqueued_at for job in members)
    names = sorted(counts)
    joined = await conn.fetch(
        _q(JOIN_GROUPS, schema), names, [counts[n] for n in names], [dead[n] for n in names], [now] * len(names)
    )
    if len(joined) != len(names):  # sealed by a transaction that committed after this one's check
        late = sorted(set(names) - {row[0] for row in joined})
        raise ValueError(f"group {late[0]!r} is sealed: it takes no new member")
    await conn.execute(_q(MARK, schema), sorted(rows[job.id][0] for job in members), IN_GROUP)


# -- ends ----------------------------------------------------------------------------------------------------


async def settle_ends(conn: Connection, schema: str, ends: Sequence[End], now_ms: int, ripple: Ripple) -> None:
    """What ``ends`` (jobs in a graph that just ended, with their ``links``) do to their dependants and groups, a
    killed dependant ending in turn (the SQLite driver's ``settle_ends``); a release notifies every host."""
    released = ripple.released
    while ends:
        dependencies = {seq: status for seq, status, links in ends if links & HAS_DEPENDANTS}
        members = [(seq, status) for seq, status, links in ends if links & IN_GROUP]
        killed: list[End] = []
        if dependencies:
            killed = await _settle_dependants(conn, schema, dependencies, now_ms, ripple)
        if members:
            await _count_members(conn, schema, members, now_ms, ripple)
        ends = killed
    if ripple.released > released:
        await conn.execute(NOTIFY, channel(schema))


async def _settle_dependants(
    conn: Connection, schema: str, ends: dict[int, str], now_ms: int, ripple: Ripple
) -> list[End]:
    rows = await conn.fetch(_q(OPEN_EDGES_OF, schema), sorted(ends))
    if not rows:
        return []
    plan = plan_ends(ends, [(int(dependency), int(dependant), str(policy)) for dependency, dependant, policy in rows])
    states = [(*edge, MET) for edge in plan.met] + [(*edge, FAILED) for edge in plan.failed]
    if states:
        await conn.execute(_q(SET_EDGES, schema), *map(list, zip(*states, strict=True)))
    if plan.decrements:
        seqs, counts = zip(*plan.decrements, strict=True)
        moved = await conn.fetch(_q(MEET, schema), list(seqs), list(counts), now_ms)
        ripple.released += sum(row[0] == PENDING for row in moved)
    if not plan.kills:
        return []
    killed = await conn.fetch(_q(KILL, schema), plan.kills, now_ms)
    return [(int(seq), DEAD, int(links)) for seq, links in killed if links]


async def _count_members(
    conn: Connection, schema: str, ends: Sequence[tuple[int, str]], now_ms: int, ripple: Ripple
) -> None:
    status_of = dict(ends)
    groups = await conn.fetch(_q(GROUPS_OF, schema), sorted(status_of))
    done: Counter[str] = Counter(name for seq, name in groups if status_of[seq] != DEAD)
    dead: Counter[str] = Counter(name for seq, name in groups if status_of[seq] == DEAD)
    names = sorted({str(name) for _seq, name in groups})
    for name in names:
        await conn.execute(_q(COUNT_ENDS, schema), name, done[name], dead[name])
    await complete_groups(conn, schema, names, now_ms, ripple)


async def complete_groups(conn: Connection, schema: str, names: Iterable[str], now_ms: int, ripple: Ripple) -> None:
    """Complete each sealed group of ``names`` whose members have all ended (once: the compare-and-set on
    ``completed_at`` under the row's lock), releasing its callback with the outcome in its body."""
    for name in names:
        row = await conn.fetchrow(_q(COMPLETE, schema), name, now_ms)
        if row is None or row["callback_seq"] is None:
            continue
        body = await conn.fetchval(_q(BODY_OF, schema), row["callback_seq"])
        if body is None:  # the callback was cancelled and pruned before its group completed
            continue
        outcome = GroupOutcome(name, int(row["members"]), int(row["done"]), int(row["dead"]))
        text = callback_body(decode_stored(body), outcome)
        status = await conn.fetchval(_q(RELEASE_CALLBACK, schema), row["callback_seq"], text, now_ms)
        ripple.released += status == PENDING


async def seal(
    conn: Connection, schema: str, name: str, callback: NewJob | None, now_ms: int, insert: Insert, ripple: Ripple
) -> bool:
    """Seal ``name`` with its callback stored waiting for it, and complete it if every member has ended; ``False``
    (nothing changes) if it was sealed before; ``Conflict`` if the callback's id is taken by another job."""
    await conn.execute(_q(ENSURE_GROUP, schema), name, now_ms)
    if await conn.fetchval(_q(LOCK_GROUP, schema), name) is not None:
        return False
    callback_seq = None
    if callback is not None:
        taken = Conflict(f"the id {callback.id!r} of group {name!r}'s callback is taken by another job")
        try:
            if await insert([callback]) != [True]:
                raise taken
        except Conflict:
            raise taken from None
        callback_seq = (await _id_seq_status(conn, schema, [callback.id]))[callback.id][0]
        await conn.execute(_q(AWAIT_GROUP, schema), callback_seq)
    await conn.execute(_q(SEAL, schema), name, now_ms, callback_seq)
    await complete_groups(conn, schema, [name], now_ms, ripple)
    if ripple.released:
        await conn.execute(NOTIFY, channel(schema))
    return True


# -- operators -----------------------------------------------------------------------------------------------


async def plan_rearm(conn: Connection, schema: str, seq: int, job_id: str) -> tuple[Rearm | None, str | None]:
    """Before a dead job's redrive changes anything (its row locked): its edges not met evaluated again
    (``ValueError`` if one would fail at once), or ``None`` if it waits for nothing; and its group."""
    row = await conn.fetchrow(_q(GRAPH_OF, schema), seq)
    assert row is not None
    waits, group = int(row[0]), row[1]
    if not waits:
        return None, group
    edges = [
        (int(dependency), dep_id or "?", policy, state, status)
        for dependency, dep_id, policy, state, status in await conn.fetch(_q(EDGES_NOT_MET, schema), seq)
    ]
    awaits_group = await conn.fetchval(_q(AWAITS_GROUP, schema), seq) is not None
    return plan_redrive(job_id, edges, awaits_group), group


async def rearm(conn: Connection, schema: str, seq: int, plan: Rearm | None, group: str | None) -> None:
    """After the redrive's statement: its edges met now, the others open again, ``waiting`` while any is not met;
    a member of a group not complete no longer counted dead."""
    if plan is not None:
        if plan.met:
            await conn.execute(_q(SET_EDGES, schema), plan.met, [seq] * len(plan.met), [MET] * len(plan.met))
        await conn.execute(_q(REOPEN, schema), seq)
        await conn.execute(_q(REARM, schema), seq, plan.waits)
    if group is not None:
        await conn.execute(_q(UNCOUNT_DEAD, schema), group)
