"""A finish item decided on a job's state: the store-neutral half of every driver's finish (no I/O here).

A driver reads the row (or takes the claim's snapshot, ``Held``), calls ``decide_item``, and writes the result as
one compare-and-set on exactly the columns the decision read. The decision itself is ``decide_finish``'s.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from asyncq.core.jobs import Finish, Held
from asyncq.core.lifecycle import LEASED, Change, Fence, JobState, decide_finish


class Verdict(NamedTuple):
    """A finish that may land: the state it was decided on (the compare-and-set's columns), the change, and the
    attempts the row keeps (one more than the state's for a job claimed ahead whose attempt was not counted)."""

    state: JobState
    change: Change
    attempts: int


def snapshot(fence: Fence, held: Held) -> JobState:
    """The leased row as its claim returned it, with the fence's (possibly renewed) ``lease_until``."""
    return JobState(
        LEASED, fence.attempt, held.max_attempts, fence.token, fence.owner, fence.lease_until, held.deadline
    )


def decide_item(item: Finish, state: JobState, now_ms: int) -> Verdict | None:
    """The verdict on ``item`` against ``state``, or ``None`` if it is stale. A job claimed ahead whose attempt
    was not counted yet is decided as the attempt it is (one more), and the row counts it."""
    fence, decided = item.fence, state
    if not item.counted:
        fence = Fence(fence.owner, fence.token, fence.attempt + 1, fence.lease_until)
        decided = state._replace(attempts=state.attempts + 1)
    change = decide_finish(decided, fence, item.outcome, now_ms, item.delay_ms)
    return None if change is None else Verdict(state, change, decided.attempts)


def all_held_once(items: Sequence[Finish]) -> bool:
    """Whether every item carries a snapshot and names a job no other item names (then a batch may be decided
    without reading a row and written as one statement)."""
    seqs = {item.held.seq for item in items if item.held is not None}
    return len(seqs) == len(items)
