"""The finish half of a group commit, planned once for every store (no I/O here).

Each item is decided (``core.settling.decide_item``) as stale or as a compare-and-set: the change it writes
(``FinishChange``, shared by every row of one statement) and the columns it compares (``FinishRow``). A pool's
batch (every item with the claim's snapshot, one per job) is decided without a read (``plan_held``); any other
batch on the rows ``rows_to_read`` names, item by item (``decide_each``). A plan groups the rows by change, each
with its item's place in the batch; a driver writes each group with its own statements, collects the ``seq`` of
every row that landed, and asks ``statuses_after`` and ``kept`` what the items became and what to keep beside
the rows (errors and results, the error under ``attempt_after``'s number) in the same transaction.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any, NamedTuple

from asyncq.core.failures import ErrorText
from asyncq.core.jobs import Finish, StoredResult
from asyncq.core.lifecycle import DONE, JobState
from asyncq.core.settling import decide_item, snapshot

_make: Any = tuple.__new__  # a named tuple without its constructor's Python call, for per-job values


class FinishChange(NamedTuple):
    """What a finish writes to its row, and the owner the row must still have: the same for every row of one
    statement (a pool's batch of ``ok`` results has one or two: claimed ahead or not)."""

    status: str
    reason: str | None
    available_at: int
    counts: int  # 1: the attempt is counted now (a job claimed ahead, finished before it was counted); else 0
    owner: str


class FinishRow(NamedTuple):
    """One finish's compare-and-set columns besides the owner. The id is compared too: two jobs claimed together
    can match in every other column."""

    seq: int
    id: str
    token: int
    attempts: int
    lease_until: int | None
    max_attempts: int
    deadline: int


#: The rows that may land, by their change, each with its item's position in the batch (in the batch's order).
FinishPlan = dict[FinishChange, list[tuple[int, FinishRow]]]


def decide_row(item: Finish, seq: int, state: JobState, now_ms: int) -> tuple[FinishChange, FinishRow] | None:
    """``item`` decided on ``state`` (its row's, ``seq``): its change and compare-and-set row, ``None`` if stale."""
    decision = decide_item(item, state, now_ms)
    if decision is None:
        return None
    _status, attempts, max_attempts, token, _owner, lease_until, deadline = state
    change: FinishChange = _make(FinishChange, (*decision.change, 0 if item.counted else 1, item.fence.owner))
    row: FinishRow = _make(FinishRow, (seq, item.id, token, attempts, lease_until, max_attempts, deadline))
    return change, row


def rows_to_read(items: Sequence[Finish], on_rows: Collection[str] = ()) -> list[str]:
    """The ids whose rows ``decide_each`` needs: the items without a snapshot, and those named in ``on_rows``."""
    return [item.id for item in items if item.held is None or item.id in on_rows]


def decide_each(
    items: Sequence[Finish], found: Mapping[str, tuple[int, JobState]], now_ms: int, on_rows: Collection[str] = ()
) -> list[tuple[FinishChange, FinishRow] | None]:
    """Each item decided on its own (for a batch written item by item): on its row as read before the batch
    (``found``: id → ``(seq, state)``; an item of ``rows_to_read`` whose row is missing is stale), else on its
    snapshot. A second item of a job the batch already finished is decided on the row before the first; its
    compare-and-set does not land."""
    decided: list[tuple[FinishChange, FinishRow] | None] = []
    for item in items:
        held = item.held
        if held is None or item.id in on_rows:
            row = found.get(item.id)
            decided.append(None if row is None else decide_row(item, row[0], row[1], now_ms))
        else:
            decided.append(decide_row(item, held.seq, snapshot(item.fence, held), now_ms))
    return decided


def plan_held(items: Sequence[Finish], now_ms: int) -> FinishPlan:
    """The plan for items that all carry the claim's snapshot (``held``) and name distinct jobs
    (``settling.all_held_once``): each decided on its snapshot, no row read."""
    plan: FinishPlan = {}
    for position, item in enumerate(items):
        held = item.held
        if held is None:
            raise ValueError(f"item {position} has no snapshot: decide it on its row (decide_row)")
        decided = decide_row(item, held.seq, snapshot(item.fence, held), now_ms)
        if decided is None:
            continue
        change, row = decided
        rows = plan.get(change)
        if rows is None:
            rows = plan[change] = []
        rows.append((position, row))
    return plan


class RowNow(NamedTuple):
    """What a row holds now, read for a finish whose compare-and-set did not land (``landed_before``)."""

    seq: int
    status: str
    reason: str | None
    token: int
    owner: str | None
    attempts: int


def unlanded(plan: FinishPlan, landed: Collection[int]) -> list[int]:
    """The ``seq`` of every planned row whose compare-and-set did not land (to read for ``landed_before``)."""
    return [row.seq for rows in plan.values() for _position, row in rows if row.seq not in landed]


def landed_before(plan: FinishPlan, landed: Collection[int], rows_now: Mapping[int, RowNow]) -> set[int]:
    """``landed`` and the rows that refused their finish only because that same finish is already there: the row
    holds, under the lease's own token and with no owner, what the finish writes (status, reason, attempts; not a
    retry's due time, which the resend computes from a later ``now``). That is the finish's own earlier commit,
    whose reply was lost (a connection cut after ``COMMIT``), sent again: it landed, and is not stale. Only the
    token's holder writes ``done`` or a retry under it; where the sweep ended the row as the finish itself would
    have (``exhausted``, ``deadline``), calling it landed says what the row holds. What the finish keeps beside its
    row (an error, a result) is not kept again: ``kept`` is asked with ``landed`` only."""
    found = set(landed)
    for change, rows in plan.items():
        for _position, row in rows:
            now = rows_now.get(row.seq)
            if row.seq in found or now is None:
                continue
            if (
                now.token == row.token
                and now.owner is None
                and now.status == change.status
                and now.reason == change.reason
                and now.attempts == attempt_after(change, row)
            ):
                found.add(row.seq)
    return found


def attempt_after(change: FinishChange, row: FinishRow) -> int:
    """The attempts a landed finish leaves on its row: the number of the attempt that ended, which is the one
    kept with its error (for a job claimed ahead, the finish counts the attempt: one more than the claim's)."""
    return row.attempts + change.counts


def statuses_after(plan: FinishPlan, landed: Collection[int], size: int) -> list[str | None]:
    """The new status of each of the batch's ``size`` items, ``None`` for a stale one, once the rows whose
    ``seq`` is in ``landed`` did land."""
    found: list[str | None] = [None] * size
    for change, rows in plan.items():
        for position, row in rows:
            if row.seq in landed:
                found[position] = change.status
    return found


def kept(
    items: Sequence[Finish], plan: FinishPlan, found: Sequence[str | None]
) -> tuple[list[tuple[int, int, ErrorText]], list[tuple[int, StoredResult]]]:
    """What the landed finishes keep beside their rows: ``(seq, attempt, error)`` for each failed attempt that
    carries its error, ``(seq, result)`` for each landed as done that carries a result."""
    errors: list[tuple[int, int, ErrorText]] = []
    results: list[tuple[int, StoredResult]] = []
    for change, rows in plan.items():
        for position, row in rows:
            item = items[position]
            if found[position] is None or (item.error is None and item.result is None):
                continue
            if item.error is not None:
                errors.append((row.seq, attempt_after(change, row), item.error))
            if item.result is not None and change.status == DONE:
                results.append((row.seq, item.result))
    return errors, results
