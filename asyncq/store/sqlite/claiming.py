"""The claim half of a group commit on SQLite: the sweep (a parked job in a graph settles its dependants and group),
a claim statement of the layout (the lab's by ``seq``, the product's in ``core.claim_plan``'s order), a limited
queue's claim (``limits.claim_limited``), and the plan's claims one after the other (``claim_planned``). The plan and
every rule are ``asyncq.core``'s; these functions run statements and say what they found. They run inside a write
transaction the caller holds.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from typing import Any

from asyncq.core.claim_plan import Claim, ClaimPlan, in_claim_order, next_claim
from asyncq.core.dependencies import Ripple
from asyncq.core.flow_limits import Hold
from asyncq.core.jobs import Ticket
from asyncq.core.lifecycle import DEAD
from asyncq.store.sqlite import graphs
from asyncq.store.sqlite.limits import claim_limited, is_limited
from asyncq.store.sqlite.schema import Layout
from asyncq.store.sqlite.statements import sql


def claim_rows_in_transaction(
    con: sqlite3.Connection,
    layout: Layout,
    owner: str,
    now_ms: int,
    lease_ms: int,
    *,
    limit: int = 1,
    scope: dict[str, Any] | None = None,
    count: bool = True,
    sweep: bool = True,
) -> list[tuple[Any, ...]]:
    """The sweep and the claim, inside a transaction the caller holds: the claimed rows as the layout's claim
    statement returns them (the lab's: ``seq, id, payload…, owner, token, attempts, lease_until, deadline,
    max_attempts``; the product's: ``statements.CLAIMED``), in the claim order (the lab's: ``seq``; the product's:
    ``claim_rank``).
    ``count=False`` claims ahead: the attempt is counted when a handler starts the job;
    ``sweep=False`` skips the sweep, already run in this transaction (the sweeps cover every queue)."""
    params = {"now": now_ms, "owner": owner, "lease_ms": lease_ms, "limit": limit, "count": int(count)}
    params |= scope or {}
    if sweep:
        sweep_unclaimable(con, layout, now_ms)
    rows = con.execute(sql(layout, layout.claim), params).fetchall()
    return sorted(rows) if layout.settings is None else in_claim_order(rows)


def claim_planned(
    con: sqlite3.Connection,
    layout: Layout,
    plan: ClaimPlan,
    wants: Sequence[tuple[dict[str, Any], int]],
    params: dict[str, Any],
    limited: set[str],
) -> tuple[list[Ticket], tuple[Hold, ...]]:
    """Run ``plan``'s claims over the scopes of ``wants`` (``params``: the claim's ``now``, ``owner``, ``lease_ms``),
    the sweep already run: the product's tickets claimed (counted ones first) and the queues
    their limits held. ``limited`` is the caller's hint of the queues found limited before (kept up to date here)."""
    claimed: list[Ticket] = []
    owner, lease_end = params["owner"], params["now"] + params["lease_ms"]
    dry: set[int] = set()  # queues found with no ready job left, and limited queues once asked
    holds: list[Hold] = []
    claim = next_claim(plan, 0, 0)
    while claim is not None:
        scope = wants[claim.queue][0]
        rows, was_limited, hold = _claim_one(con, layout, claim, scope, params, limited)
        claimed += [Ticket.from_row(row, claim.counts, scope["queue"], owner, lease_end) for row in rows]
        holds += [] if hold is None else [hold]
        if was_limited or len(rows) < claim.limit:
            dry.add(claim.queue)
        claim = next_claim(plan, claim.step + 1, len(claimed), dry)
    return claimed, tuple(holds)


def _claim_one(
    con: sqlite3.Connection,
    layout: Layout,
    claim: Claim,
    scope: dict[str, Any],
    params: dict[str, Any],
    limited: set[str],
) -> tuple[list[tuple[Any, ...]], bool, Hold | None]:
    """One claim statement of the plan: the plain claim, or a limited queue's (``limits.claim_limited``), with
    whether the queue was limited and what held it. The plain claim takes nothing from a limited queue, so only a
    claim that found nothing reads whether the queue is limited (a primary-key read); ``limited`` remembers it."""
    queue = scope.get("queue")
    if queue is not None and queue in limited:
        done = claim_limited(con, queue, claim.limit, claim.counts, params)
        if done is not None:
            return in_claim_order(done[0]), True, done[1]
        limited.discard(queue)
    rows = claim_rows_in_transaction(
        con, layout, params["owner"], params["now"], params["lease_ms"], limit=claim.limit, scope=scope,
        count=claim.counts, sweep=False,
    )  # fmt: skip
    if rows or layout.settings is None or queue is None or not is_limited(con, queue):
        return rows, False, None
    limited.add(queue)
    done = claim_limited(con, queue, claim.limit, claim.counts, params)
    return ([], True, None) if done is None else (in_claim_order(done[0]), True, done[1])


def sweep_unclaimable(con: sqlite3.Connection, layout: Layout, now_ms: int, ripple: Ripple | None = None) -> None:
    """Park every unclaimable row (deadline passed, attempts used up, a cancel requested; a waiting job past its
    deadline) as dead, in every queue: once a claim. A parked job in a graph has its dependants and group settled
    (``ripple`` counts what that released)."""
    params = {"now": now_ms}
    parked = con.execute(sql(layout, "SWEEP_DEADLINE"), params).fetchall()
    parked += con.execute(sql(layout, "SWEEP_EXHAUSTED"), params).fetchall()
    if layout.cancels:
        parked += con.execute(sql(layout, "SWEEP_CANCELLED"), params).fetchall()
    linked = [(seq, DEAD, links) for seq, links in parked if links is not None]
    if linked:
        graphs.settle_ends(con, linked, now_ms, Ripple() if ripple is None else ripple)
