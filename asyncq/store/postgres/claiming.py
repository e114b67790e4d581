"""The claim half of a group commit on PostgreSQL: the sweep (a parked job in a graph settles its dependants and
group) and the plan's claims (``core.claim_plan``), each queue's by the plain claim statement (``statements.CLAIM``)
or a limited queue's (``limits.claim_limited``), inside a transaction the caller holds. The plans and rules are
``asyncq.core``'s; these functions run statements.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from asyncq.core.claim_plan import Claim, ClaimPlan, in_claim_order, next_claim
from asyncq.core.dependencies import Ripple
from asyncq.core.flow_limits import Hold
from asyncq.core.jobs import Ticket
from asyncq.core.lifecycle import DEAD
from asyncq.store.postgres import graphs
from asyncq.store.postgres.connection import Connection
from asyncq.store.postgres.limits import claim_limited, is_limited
from asyncq.store.postgres.statements import sql


async def sweep(conn: Connection, schema: str, now_ms: int, ripple: Ripple | None = None) -> None:
    """Park every unclaimable row (deadline passed, attempts used up, a cancel requested; a waiting job past its
    deadline) as dead, in every queue; a parked job in a graph has its dependants and group settled."""
    parked = list(await conn.fetch(sql(schema, "SWEEP_DEADLINE"), now_ms))
    parked += await conn.fetch(sql(schema, "SWEEP_EXHAUSTED"), now_ms)
    parked += await conn.fetch(sql(schema, "SWEEP_CANCELLED"), now_ms)
    linked = [(int(seq), DEAD, int(links)) for seq, links in parked if links is not None]
    if linked:
        await graphs.settle_ends(conn, schema, linked, now_ms, Ripple() if ripple is None else ripple)


async def claim(
    conn: Connection,
    schema: str,
    owner: str,
    now_ms: int,
    lease_ms: int,
    wants: Sequence[tuple[str, int]],
    plan: ClaimPlan,
    limited: set[str] | None = None,
) -> tuple[list[Ticket], tuple[Hold, ...]]:
    """Run ``plan``'s claims (``core.claim_plan``) over the queues of ``wants``, in the claim order within each
    queue (``claim_rank``): the tickets claimed, those counted first, and the queues their limits
    held. ``limited`` is the caller's hint of the queues found limited before (kept up to date here)."""
    claimed: list[Ticket] = []
    dry: set[int] = set()  # queues found with no ready job left, and limited queues once asked
    holds: list[Hold] = []
    hint = set() if limited is None else limited
    locked = False  # whether this transaction holds a limited queue's lock (the next ones are not waited for)
    step = next_claim(plan, 0, 0)
    while step is not None:
        queue = wants[step.queue][0]
        rows, was_limited, hold = await _claim_one(conn, schema, step, queue, (now_ms, owner, lease_ms), hint, locked)
        locked = locked or was_limited
        claimed += [Ticket.from_row(row, step.counts, queue, owner, now_ms + lease_ms) for row in in_claim_order(rows)]
        holds += [] if hold is None else [hold]
        if was_limited or len(rows) < step.limit:
            dry.add(step.queue)
        step = next_claim(plan, step.step + 1, len(claimed), dry)
    return claimed, tuple(holds)


async def _claim_one(
    conn: Connection,
    schema: str,
    step: Claim,
    queue: str,
    params: tuple[int, str, int],
    limited: set[str],
    locked: bool,
) -> tuple[list[tuple[Any, ...]], bool, Hold | None]:
    """One claim of the plan: the plain claim, or a limited queue's (``limits.claim_limited``), with whether the
    queue was limited and what held it. The plain claim takes nothing from a limited queue, so only a claim that
    found nothing reads whether the queue is limited (a primary-key read); ``limited`` remembers it."""
    if queue in limited:
        done = await claim_limited(conn, schema, queue, step.limit, step.counts, params, not locked)
        if done is not None:
            return done[0], True, done[1]
        limited.discard(queue)
    now_ms, owner, lease_ms = params
    found = await conn.fetch(sql(schema, "CLAIM"), queue, now_ms, step.limit, owner, lease_ms, int(step.counts))
    rows = [tuple(row) for row in found]
    if rows or not await is_limited(conn, schema, queue):
        return rows, False, None
    limited.add(queue)
    done = await claim_limited(conn, schema, queue, step.limit, step.counts, params, not locked)
    return ([], True, None) if done is None else (done[0], True, done[1])
