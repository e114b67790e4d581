"""Each lifecycle transition on PostgreSQL, as steps run inside a transaction the caller holds (an asyncpg
connection in ``conn.transaction()``). The decisions and plans are ``asyncq.core``'s (``finish_plan``,
``claim_plan``); these functions only read rows, run the plans' statements, and say which landed. Every
argument is checked by the facade already; every ``now_ms`` is the caller's.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from typing import Any

import asyncpg

from asyncq.core.dependencies import Ripple
from asyncq.core.failures import ErrorText
from asyncq.core.finish_plan import (
    FinishPlan,
    RowNow,
    attempt_after,
    decide_each,
    kept,
    landed_before,
    plan_held,
    rows_to_read,
    statuses_after,
    unlanded,
)
from asyncq.core.jobs import Enqueued, Finish, NewJob, StoredResult
from asyncq.core.lifecycle import DEAD, DONE, REASON_CANCELLED, CancelState, Fence, JobState, Renewal, decide_cancel
from asyncq.core.settling import all_held_once
from asyncq.errors import Conflict, StoreError, UniqueConflict
from asyncq.store.postgres import graphs
from asyncq.store.postgres.connection import Connection
from asyncq.store.postgres.offers import claim_for_offers, insert_for_offer
from asyncq.store.postgres.statements import sql

#: ``(seq, payload, state)`` of a stored job, as ``read_states`` returns it.
Found = tuple[int, dict[str, Any], JobState]


async def enqueue_rows(conn: Connection, schema: str, jobs: Sequence[NewJob]) -> list[Enqueued]:
    """Insert ``jobs`` in batch order: ``True`` per new job, ``False`` where the id exists (or came earlier in the
    batch) with the same payload; ``Conflict`` where it holds another payload (the caller rolls back); the id of
    the active job that holds its unique key where one does (``UniqueConflict`` for a row that asks to raise). A
    batch with dependencies or a group also stores its edges and counts (``graphs.enqueue_linked``). An idle pool's
    offer takes a job enqueued alone at its insert (``offers.insert_for_offer``), a batch's ready jobs by a claim
    after it (``offers.claim_for_offers``)."""
    if len(jobs) == 1 and await insert_for_offer(conn, schema, jobs[0]):  # leased to an idle pool's offer
        return [True]
    if any(job.linked for job in jobs):
        added = await graphs.enqueue_linked(conn, schema, jobs, partial(_enqueue_plain, conn, schema))
    else:
        added = await _enqueue_plain(conn, schema, jobs)
    if len(jobs) > 1:
        await claim_for_offers(conn, schema, jobs, added)
    return added


async def _enqueue_plain(conn: Connection, schema: str, jobs: Sequence[NewJob]) -> list[Enqueued]:
    if not jobs:
        return []
    first: dict[str, NewJob] = {}
    for job in jobs:
        first.setdefault(job.id, job)
    unique = list(first.values())
    inserted: set[str] = set()
    held: dict[str, str] = {}
    todo = unique
    for _ in range(_KEY_TRIES):
        inserted |= await _insert(conn, schema, todo)
        known = [job.id for job in todo if job.id not in inserted]
        stored = {job_id: found[1] for job_id, found in (await read_states(conn, schema, known)).items()}
        keyed = [job for job in todo if job.id not in inserted and job.id not in stored]
        for job_id, payload in stored.items():
            if any(first[job_id].payload[column] != value for column, value in payload.items()):  # task: derived
                raise Conflict(f"job {job_id!r} already exists with a different payload")
        held |= await _key_holders(conn, schema, keyed)
        # Not inserted, yet nothing holds its id or key now: the row in the way ended (its key is free) or was
        # pruned between the insert and the read. Insert those again.
        todo = [job for job in keyed if job.id not in held]
        if not todo:
            break
    else:
        raise StoreError(f"job {todo[0].id!r}: the row in its way kept changing while it was enqueued: try again")
    results: list[Enqueued] = []
    for job in jobs:
        earlier = first[job.id]
        if job.payload != earlier.payload:
            raise Conflict(f"job {job.id!r} already exists with a different payload")
        results.append(held.get(job.id, job is earlier and job.id in inserted))
    return results


#: How many times an enqueue inserts a row again whose key's holder ended before it could be read.
_KEY_TRIES = 3


async def _insert(conn: Connection, schema: str, jobs: Sequence[NewJob]) -> set[str]:
    """Insert ``jobs`` (distinct ids): the ids inserted (a known id or a held unique key inserts nothing)."""
    columns = (
        [job.id for job in jobs],
        [job.payload["queue"] for job in jobs],
        [job.payload["body"] for job in jobs],
        [job.max_attempts for job in jobs],
        [job.available_at for job in jobs],
        [job.deadline for job in jobs],
        [job.payload["priority"] for job in jobs],
        [job.payload["unique_key"] for job in jobs],
        [job.payload["task"] for job in jobs],
        [job.payload["group_name"] for job in jobs],
        [job.payload["limit_key"] for job in jobs],
    )
    return {row[0] for row in await conn.fetch(sql(schema, "INSERT_ROWS"), *columns)}


async def _key_holders(conn: Connection, schema: str, jobs: Sequence[NewJob]) -> dict[str, str]:
    """For each of ``jobs`` (not inserted, their ids new), the id of the active job holding its unique key, if one
    still does; ``UniqueConflict`` for a job that asks to raise."""
    if not jobs:
        return {}
    queues = [job.payload["queue"] for job in jobs]
    keys = [job.payload["unique_key"] for job in jobs]
    rows = await conn.fetch(sql(schema, "SELECT_KEY_HOLDERS"), queues, keys)
    holders = {(row[0], row[1]): str(row[2]) for row in rows}
    found: dict[str, str] = {}
    for job in jobs:
        queue, key = job.payload["queue"], job.payload["unique_key"]
        holder = holders.get((queue, key))
        if holder is None:
            continue
        if job.raise_on_unique:
            raise UniqueConflict(key, queue, holder, job.id)
        found[job.id] = holder
    return found


async def read_states(conn: Connection, schema: str, job_ids: Sequence[str]) -> dict[str, Found]:
    """``(seq, payload, lifecycle state)`` of each job of ``job_ids`` that exists, in one statement: the payload's
    compared columns (not ``task``, derived from the body: a row stored before the column has none)."""
    if not job_ids:
        return {}
    found: dict[str, Found] = {}
    for row in await conn.fetch(sql(schema, "SELECT_BY_IDS"), list(dict.fromkeys(job_ids))):
        seq, job_id, queue, body, status, attempts, max_attempts, token, owner, lease_until, deadline, *stored = row
        priority, key, group, limit_key = stored
        state = JobState(status, attempts, max_attempts, token, owner, lease_until, deadline)
        payload = {
            "queue": queue, "body": body, "priority": priority, "unique_key": key, "group_name": group,
            "limit_key": limit_key,
        }  # fmt: skip
        found[job_id] = (seq, payload, state)
    return found


# -- finishing ----------------------------------------------------------------------------------------------


async def finish(
    conn: Connection,
    schema: str,
    items: Sequence[Finish],
    now_ms: int,
    *,
    resend: bool = False,
    ripple: Ripple | None = None,
) -> list[str | None]:
    """Apply each item's outcome, each fenced on its own: the new status per item, ``None`` for a stale one
    (its row is left unchanged). Items with the claim's snapshot naming distinct jobs (a pool's group commit)
    are decided without a read and written as one statement; others are decided on their rows, read first,
    and written one by one, so that a second item of a job the batch already finished is refused as stale.
    The decisions are ``core.finish_plan``'s; a job in a graph that ends has its dependants and group settled in
    the same transaction (``ripple`` counts what that released)."""
    ripple = Ripple() if ripple is None else ripple
    if all_held_once(items):
        return await _write_plan(conn, schema, items, plan_held(items, now_ms), now_ms, ripple, resend)
    states = await read_states(conn, schema, rows_to_read(items))
    found = {job_id: (seq, state) for job_id, (seq, _payload, state) in states.items()}
    statuses: list[str | None] = []
    for item, decided in zip(items, decide_each(items, found, now_ms), strict=True):
        plan: FinishPlan = {} if decided is None else {decided[0]: [(0, decided[1])]}
        statuses += await _write_plan(conn, schema, [item], plan, now_ms, ripple, resend)
    return statuses


async def _write_plan(
    conn: Connection,
    schema: str,
    items: Sequence[Finish],
    plan: FinishPlan,
    now_ms: int,
    ripple: Ripple,
    resend: bool = False,
) -> list[str | None]:
    """One compare-and-set statement for every row of ``plan``, then what the landed finishes keep, then the
    dependants and groups of the landed ones in a graph that ended."""
    if not plan:
        return [None] * len(items)
    rows = [(change, row) for change, group in plan.items() for _position, row in group]
    written = await conn.fetch(
        sql(schema, "FINISH_ROWS"),
        [row.seq for _c, row in rows],
        [row.id for _c, row in rows],
        [row.token for _c, row in rows],
        [change.owner for change, _r in rows],
        [row.attempts for _c, row in rows],
        [row.lease_until for _c, row in rows],
        [row.max_attempts for _c, row in rows],
        [row.deadline for _c, row in rows],
        [change.status for change, _r in rows],
        [change.reason for change, _r in rows],
        [change.available_at for change, _r in rows],
        [attempt_after(change, row) for change, row in rows],
    )
    landed = {found[0] for found in written}
    statuses = statuses_after(plan, landed, len(items))
    errors, results = kept(items, plan, statuses)
    await _keep_errors(conn, schema, errors, now_ms)
    await _keep_results(conn, schema, results, now_ms)
    if any(links is not None for _seq, links in written):
        ended = {row.seq: change.status for change, row in rows if change.status in (DONE, DEAD)}
        linked = [(seq, ended[seq], links) for seq, links in written if links is not None and seq in ended]
        await graphs.settle_ends(conn, schema, linked, now_ms, ripple)
    missed = unlanded(plan, landed) if resend else []
    if missed:  # the same finishes sent again after a reply lost after COMMIT: those that had landed are landed
        now_rows = await conn.fetch(sql(schema, "ROWS_NOW"), missed)
        landed = landed_before(plan, landed, {row[0]: RowNow(*row) for row in now_rows})
        statuses = statuses_after(plan, landed, len(items))
    return statuses


async def _keep_results(conn: Connection, schema: str, done: Sequence[tuple[int, StoredResult]], now_ms: int) -> None:
    """The result of each finish that landed as done, in the finish's transaction."""
    if done:
        await conn.execute(
            sql(schema, "KEEP_RESULTS"),
            [seq for seq, _r in done],
            [result.json for _s, result in done],
            [now_ms] * len(done),
            [now_ms + result.keep_ms for _s, result in done],
        )


async def _keep_errors(
    conn: Connection, schema: str, errors: Sequence[tuple[int, int, ErrorText]], now_ms: int
) -> None:
    """The error of each landed finish of a failed attempt (``(seq, attempt, error)``), in its transaction."""
    if errors:
        await conn.execute(
            sql(schema, "KEEP_ERRORS"),
            [seq for seq, _a, _e in errors],
            [attempt for _s, attempt, _e in errors],
            [now_ms] * len(errors),
            [error.type for _s, _a, error in errors],
            [error.message for _s, _a, error in errors],
            [error.traceback for _s, _a, error in errors],
        )


# -- claiming -----------------------------------------------------------------------------------------------


async def activate(conn: Connection, schema: str, started: Sequence[tuple[int, str, Fence]]) -> list[bool]:
    """Count the attempt of each started job claimed ahead (``(seq, id, fence)``), fenced on its lease."""
    if not started:
        return []
    rows = await conn.fetch(
        sql(schema, "ACTIVATE_ROWS"),
        [seq for seq, _id, _f in started],
        [job_id for _s, job_id, _f in started],
        [fence.token for _s, _i, fence in started],
        [fence.owner for _s, _i, fence in started],
        [fence.attempt for _s, _i, fence in started],
        [fence.lease_until for _s, _i, fence in started],
    )
    landed = {row[0] for row in rows}
    return [seq in landed for seq, _id, _fence in started]


# -- leases -------------------------------------------------------------------------------------------------


def _lease_columns(leases: Sequence[tuple[str, Fence]]) -> list[list[Any]]:
    return [
        list(range(len(leases))),
        [job_id for job_id, _f in leases],
        [fence.owner for _i, fence in leases],
        [fence.token for _i, fence in leases],
        [fence.attempt for _i, fence in leases],
        [fence.lease_until for _i, fence in leases],
    ]


def _distinct(leases: Sequence[tuple[str, Fence]]) -> bool:
    return len({job_id for job_id, _fence in leases}) == len(leases)


async def extend(
    conn: Connection, schema: str, leases: Sequence[tuple[str, Fence]], now_ms: int, lease_ms: int
) -> list[Renewal | None]:
    """Renew held leases to ``min(now + lease_ms, deadline)``, each with whether a cancel was requested; ``None``
    for each lease no longer held. Leases of distinct jobs go as one statement; a job named twice goes lease by
    lease (the second sees the first's)."""
    if not _distinct(leases):
        return [renewal for lease in leases for renewal in await extend(conn, schema, [lease], now_ms, lease_ms)]
    rows = await conn.fetch(sql(schema, "EXTEND_ROWS"), now_ms, lease_ms, *_lease_columns(leases)) if leases else []
    renewed = {row[0]: (row[1], row[2]) for row in rows}
    return [
        None if n not in renewed else Renewal(fence._replace(lease_until=renewed[n][0]), renewed[n][1])
        for n, (_id, fence) in enumerate(leases)
    ]


async def release(
    conn: Connection, schema: str, leases: Sequence[tuple[str, Fence]], now_ms: int, refunds: Sequence[bool]
) -> list[bool]:
    """Give back held leases of jobs never started (pending again, an attempt counted at claim returned where
    ``refunds`` says); ``False`` for a lease no longer held."""
    if not _distinct(leases):
        return [
            done
            for lease, refund in zip(leases, refunds, strict=True)
            for done in await release(conn, schema, [lease], now_ms, [refund])
        ]
    if not leases:
        return []
    columns = [*_lease_columns(leases), [int(refund) for refund in refunds]]
    landed = {row[0] for row in await conn.fetch(sql(schema, "RELEASE_ROWS"), now_ms, *columns)}
    return [n in landed for n in range(len(leases))]


# -- operators ----------------------------------------------------------------------------------------------


async def redrive(conn: Connection, schema: str, job_id: str, now_ms: int, deadline_ms: int, note: str) -> Any:
    """Re-arm a dead job (attempts 0, a fresh deadline) after writing its audit row, which is returned;
    ``ValueError`` (nothing changes) if it is missing or not dead."""
    seq, token = await _locked(conn, schema, job_id, DEAD)
    holder = await conn.fetchrow(sql(schema, "KEY_HOLDER_OF"), seq)
    if holder is not None:  # its key is held by another active job: refused before any change
        raise UniqueConflict(holder["unique_key"], holder["queue"], holder["id"], job_id)
    rearm, group = await graphs.plan_rearm(conn, schema, seq, job_id)  # refused here: nothing written
    entry = await conn.fetchrow(sql(schema, "AUDIT"), job_id, seq, token, now_ms, note, "redrive", None)
    try:
        async with conn.transaction():  # a savepoint: a holder that committed since the check is a typed refusal
            await conn.execute(sql(schema, "REDRIVE"), seq, now_ms, deadline_ms)
    except asyncpg.UniqueViolationError:
        holder = await conn.fetchrow(sql(schema, "KEY_HOLDER_OF"), seq)
        key, queue, other = ("?", "?", "?") if holder is None else (holder["unique_key"], holder["queue"], holder["id"])
        raise UniqueConflict(key, queue, other, job_id) from None
    await graphs.rearm(conn, schema, seq, rearm, group)
    return entry


async def cancel(
    conn: Connection, schema: str, job_id: str, now_ms: int, note: str, ripple: Ripple | None = None
) -> tuple[CancelState, Any, str]:
    """Cancel a job as ``core.lifecycle.decide_cancel`` decides on its row, locked: end it dead (``cancelled``) or
    store a request for its holder, each with an audit row; ``too_late`` changes nothing. The decision, the audit
    row written (``None``: none, also for a request made again) and the status it had; ``ValueError`` if missing."""
    row = await conn.fetchrow(sql(schema, "LOCK_FOR_CANCEL"), job_id)
    if row is None:
        raise ValueError(f"job {job_id!r} is missing")
    seq, status, token = int(row["seq"]), str(row["status"]), int(row["token"])
    decided = decide_cancel(JobState(*tuple(row)[1:8]), now_ms)
    if decided is CancelState.TOO_LATE:
        return decided, None, status
    if decided is CancelState.CANCELLED:
        links = await conn.fetchval(sql(schema, "CANCEL"), seq, now_ms)
        if links is not None:  # a job in a graph: its dependants and group are settled with it
            ended = [(seq, DEAD, int(links))]
            await graphs.settle_ends(conn, schema, ended, now_ms, Ripple() if ripple is None else ripple)
    elif await conn.execute(sql(schema, "REQUEST_CANCEL"), seq, now_ms) == "UPDATE 0":
        return decided, None, status  # a request stored already
    action = "cancel" if decided is CancelState.CANCELLED else "cancel_request"
    entry = await conn.fetchrow(sql(schema, "AUDIT"), job_id, seq, token, now_ms, note, action, REASON_CANCELLED)
    return decided, entry, status


async def _locked(conn: Connection, schema: str, job_id: str, status: str) -> tuple[int, int]:
    """``(seq, token)`` of ``job_id``, its row locked, if it is in ``status``; ``ValueError`` otherwise."""
    row = await conn.fetchrow(sql(schema, "LOCK_ONE"), job_id)
    if row is None or row["status"] != status:
        raise ValueError(f"job {job_id!r} is {'missing' if row is None else 'not ' + status}")
    return int(row["seq"]), int(row["token"])
