"""The claim half of a worker pool's group commit, planned once for every store (no I/O here).

A group commit starts the jobs claimed ahead that handlers began, finishes (``core.finish_plan``), sweeps if
anything is wanted, claims the jobs that start now (their attempt counted), then claims ahead (counted when a
handler starts them). ``plan_claim`` turns what each queue wants into that plan; a driver runs it statement by
statement, asking ``next_claim`` what to claim after each claim statement::

    plan = plan_claim([n for _queue, n in wants], total, start_now)
    if plan.sweep: ...run the sweep...
    claim, taken, dry = next_claim(plan, 0, 0), 0, set()
    while claim is not None:
        rows = ...claim up to claim.limit jobs of wants[claim.queue], counting the attempt if claim.counts...
        taken += len(rows)
        if len(rows) < claim.limit:
            dry.add(claim.queue)
        claim = next_claim(plan, claim.step + 1, taken, dry)

How many a claim may take depends on what the claims before it found (a queue with fewer ready jobs than it
wants leaves room for the next), so the plan is a step function of the rows claimed so far, not a list. A queue
whose claim came back short has no ready job left in this transaction (the write lock is held and ``now`` is
fixed), so no later claim of the same commit asks it again: a pool's claim of one job for a free slot is one
statement, not two (the empty claim ahead cost 20 µs of the 140 µs a one-job commit holds the lock).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from operator import itemgetter
from typing import Any, NamedTuple


class ClaimPlan(NamedTuple):
    """What a group commit claims: ``wants`` (per queue, in the driver's order, the most it may take in each
    phase), ``phases`` (``(count, budget)`` each: whether the claimed jobs count an attempt now, and the most
    jobs claimed by the end of the phase over every queue, ``None`` for no bound), and whether to ``sweep``."""

    wants: tuple[int, ...]
    phases: tuple[tuple[bool, int | None], ...]
    sweep: bool


class Claim(NamedTuple):
    """One claim statement: up to ``limit`` jobs of the ``queue``-th want, ``counts`` saying whether their attempt
    counts now; ``step`` is its place in the plan (pass ``step + 1`` to ``next_claim``)."""

    step: int
    queue: int
    limit: int
    counts: bool


def plan_claim(wants: Sequence[int], total: int | None, start_now: int | None) -> ClaimPlan:
    """The plan for claiming up to ``wants[i]`` jobs of each queue, at most ``total`` in all (``None``: no bound),
    the first ``start_now`` of them counted (``None``: all, and nothing is claimed ahead).

    A rule of a claim decided from values enters here or in ``limited_take``: a limited queue's want is lowered,
    statement by statement, to what its limits allow (the drivers read the limits under the claim's lock); the
    drivers run whatever plan comes out. Stored state that no process may act on stale
    (a pause, a ``max_wait``) is read by the claim statement itself, and the order within a queue is
    ``claim_rank``'s (below)."""
    sweep = (total is None or total > 0) and any(n > 0 for n in wants)
    first = start_now if start_now is not None else total
    phases: tuple[tuple[bool, int | None], ...] = ((True, first),)
    if start_now is not None:
        phases += ((False, total),)
    return ClaimPlan(tuple(wants), phases, sweep)


def next_claim(plan: ClaimPlan, step: int, taken: int, dry: Collection[int] = ()) -> Claim | None:
    """The first claim statement of ``plan`` from ``step`` on that may take a job, once the statements before
    it claimed ``taken`` jobs in all and the queues in ``dry`` (their places in ``wants``) came back short;
    ``None`` when the plan is done. A claim takes at most its queue's want, and no more than its phase's budget
    leaves."""
    width = len(plan.wants)
    for at in range(step, width * len(plan.phases)):
        if at % width in dry:
            continue
        count, budget = plan.phases[at // width]
        want = plan.wants[at % width]
        limit = want if budget is None else min(want, budget - taken)
        if limit > 0:
            return Claim(at, at % width, limit, count)
    return None


def limited_take(counts: bool, want: int, allowed: int) -> int:
    """How many jobs one claim statement of a limited queue takes (``core.flow_limits``): none when the claim is ahead
    of the free slots (``counts`` false: a job claimed ahead would hold a slot while it waits in a buffer, so a
    limited queue's jobs are claimed only for free slots, and start at once), else its ``want`` at most and no more
    than its limits ``allowed``. A limited queue is asked once per commit: the driver marks it dry after its turn."""
    return min(want, allowed) if counts else 0


# -- the order of a claim --------------------------------------------------------------------------------------
#
# Within a queue, ready jobs are claimed in this order (each driver's claim statement selects in it, and what
# it returns is sorted by ``claim_rank`` so that the jobs that start now are the first of that order):
#
# 1. a job ready for longer than its queue's ``max_wait`` (``late``), oldest ready first: a low priority's wait
#    is bounded;
# 2. then higher ``priority`` first;
# 3. then the earlier ``ready_at`` (``available_at``: when it was enqueued, its delay ended, or its retry was due);
# 4. then ``seq`` (enqueue order).
#
# The lab's tables (``asyncq.lab``) have no priority and keep their contract's order, ``seq`` alone.

#: A claimed row's rank: compare ranks to compare rows in the claim order.
Rank = tuple[int, int, int, int]


def claim_rank(priority: int, ready_at: int, seq: int, late: bool) -> Rank:
    """Where a ready job comes in its queue's claim order (lower first; see the order above)."""
    return (0, 0, ready_at, seq) if late else (1, -priority, ready_at, seq)


#: ``claim_rank`` less its ``seq``, packed into one integer that a claim statement returns as its last column
#: (``packed_rank``): one column read a claimed row instead of three (``ready_at``, ``late`` and the priority's
#: place), and one sort keyed in C. A ``ready_at`` is at most ``values.TIME_MAX_MS`` plus a year's ttl, below
#: 2**50; ``101 - priority`` is 1 … 201, so the packed value stays below 2**58.
RANK_PRIORITY_STEP = 2**50


def packed_rank(priority: int, ready_at: int, late: bool) -> int:
    """``claim_rank`` of a row without its ``seq``, as one integer (the drivers compute it in SQL, as
    ``CASE WHEN late THEN available_at ELSE (101 - priority) * RANK_PRIORITY_STEP + available_at END``): rows
    compare as their ``(packed_rank, seq)`` do as their ``claim_rank`` (``tests/test_cycle_plan.py``)."""
    return ready_at if late else (101 - priority) * RANK_PRIORITY_STEP + ready_at


def in_claim_order(rows: list[tuple[Any, ...]], rank: int = -1, seq: int = 0) -> list[tuple[Any, ...]]:
    """Claimed rows, sorted in place by their ``packed_rank`` (at ``rank``) then ``seq``, and returned: the order of
    ``claim_rank``."""
    rows.sort(key=itemgetter(rank, seq))
    return rows
