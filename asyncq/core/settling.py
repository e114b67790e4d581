"""A finish item decided on a job's state: the store-neutral half of every driver's finish (no I/O here).

A driver reads the row (or takes the claim's snapshot, ``Held``), calls ``decide_item``, and writes the result as
one compare-and-set on exactly the columns the decision read. The decision itself is ``decide_finish``'s.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

from asyncq.core.jobs import Finish, Held
from asyncq.core.lifecycle import LEASED, Change, Fence, JobState, decide_finish

_make: Any = tuple.__new__  # a named tuple without its constructor's Python call, for per-job values


class FinishDecision(NamedTuple):
    """A finish that may land: the state it was decided on (the compare-and-set's columns), the change, and the
    attempts the row keeps (one more than the state's for a job claimed ahead whose attempt was not counted)."""

    state: JobState
    change: Change
    attempts: int


def snapshot(fence: Fence, held: Held) -> JobState:
    """The leased row as its claim returned it, with the fence's (possibly renewed) ``lease_until``."""
    owner, token, attempt, lease_until = fence
    state: JobState = _make(JobState, (LEASED, attempt, held.max_attempts, token, owner, lease_until, held.deadline))
    return state


def decide_item(item: Finish, state: JobState, now_ms: int) -> FinishDecision | None:
    """The decision on ``item`` against ``state``, or ``None`` if it is stale. A job claimed ahead whose attempt
    was not counted yet is decided as the attempt it is (one more), and the row counts it."""
    fence, attempts = item.fence, state.attempts
    if not item.counted:  # built with tuple.__new__: a group commit decides every job (1.5 µs for _replace)
        owner, token, attempt, lease_until = fence
        fence = _make(Fence, (owner, token, attempt + 1, lease_until))
        attempts += 1
        state_now: JobState = _make(JobState, (state[0], attempts, *state[2:]))
    else:
        state_now = state
    change = decide_finish(state_now, fence, item.outcome, now_ms, item.delay_ms)
    if change is None:
        return None
    decision: FinishDecision = _make(FinishDecision, (state, change, attempts))
    return decision


def all_held_once(items: Sequence[Finish]) -> bool:
    """Whether every item carries a snapshot and names a job no other item names (then a batch may be decided
    without reading a row and written as one statement)."""
    seqs = {item.held.seq for item in items if item.held is not None}
    return len(seqs) == len(items)
