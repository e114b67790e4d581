"""The group commit's plans (``core.claim_plan``, ``core.finish_plan``) as pure functions: tables of cases.

The claim plan is run here against queues holding a given number of ready jobs, as a driver runs it; the finish
plan against snapshots. The conformance suite runs the same plans through each driver's statements.
"""

from __future__ import annotations

import random

import pytest

from asyncq.core.claim_plan import (
    Claim,
    ClaimPlan,
    claim_rank,
    in_claim_order,
    next_claim,
    packed_rank,
    plan_claim,
)
from asyncq.core.failures import ErrorText
from asyncq.core.finish_plan import (
    FinishChange,
    FinishRow,
    attempt_after,
    decide_each,
    decide_row,
    kept,
    plan_held,
    rows_to_read,
    statuses_after,
)
from asyncq.core.jobs import Finish, Held, StoredResult
from asyncq.core.lifecycle import LEASED, Fence, JobState
from asyncq.core.limits import MAX_PRIORITY, MAX_TTL_MS, MIN_PRIORITY
from asyncq.core.settling import snapshot
from asyncq.core.values import TIME_MAX_MS

NOW = 1_000_000
BOOM = ErrorText("ValueError", "boom", "Traceback …")


def run(plan: ClaimPlan, ready: list[int]) -> tuple[list[Claim], list[int], list[int]]:
    """Run ``plan`` as a driver does against queues with ``ready[i]`` ready jobs: the claims made, and per queue
    the jobs claimed counted and claimed ahead."""
    left, counted, ahead = list(ready), [0] * len(ready), [0] * len(ready)
    claims: list[Claim] = []
    taken, dry = 0, set()
    claim = next_claim(plan, 0, 0)
    while claim is not None:
        claims.append(claim)
        got = min(claim.limit, left[claim.queue])
        left[claim.queue] -= got
        (counted if claim.counts else ahead)[claim.queue] += got
        taken += got
        if got < claim.limit:
            dry.add(claim.queue)
        claim = next_claim(plan, claim.step + 1, taken, dry)
    return claims, counted, ahead


# wants, total, start_now, ready per queue -> counted per queue, ahead per queue
CLAIMS = [
    pytest.param([5], None, None, [9], [5], [0], id="one-queue-no-bound"),
    pytest.param([5], 3, None, [9], [3], [0], id="the-total-bounds-the-want"),
    pytest.param([4, 4], 4, None, [1, 9], [1, 3], [0, 0], id="a-short-queue-leaves-room-for-the-next"),
    pytest.param([4, 4], 4, None, [9, 9], [4, 0], [0, 0], id="the-first-queue-fills-the-total"),
    pytest.param([4, 4], 6, 2, [9, 9], [2, 0], [4, 0], id="two-start-now-the-rest-ahead"),
    pytest.param([4, 4], 6, 2, [1, 9], [1, 1], [0, 4], id="ahead-fills-what-the-counted-left"),
    pytest.param([4], 4, 0, [9], [0], [4], id="all-ahead"),
    pytest.param([4], 4, 4, [9], [4], [0], id="all-counted-none-ahead"),
    pytest.param([0, 3], 3, None, [9, 9], [0, 3], [0, 0], id="a-queue-wanting-nothing-is-passed-over"),
    pytest.param([3], 0, None, [9], [0], [0], id="a-zero-total-claims-nothing"),
    pytest.param([], 5, 2, [], [], [], id="no-queues"),
    pytest.param([2, 2], None, 1, [9, 9], [1, 0], [2, 2], id="no-total-the-ahead-phase-takes-each-want"),
]


@pytest.mark.parametrize(("wants", "total", "start_now", "ready", "counted", "ahead"), CLAIMS)
def test_the_claim_plan_takes_each_queues_want_within_each_phases_budget(
    wants: list[int], total: int | None, start_now: int | None, ready: list[int], counted: list[int], ahead: list[int]
) -> None:
    claims, got_counted, got_ahead = run(plan_claim(wants, total, start_now), ready)
    assert (got_counted, got_ahead) == (counted, ahead)
    assert all(claim.limit > 0 for claim in claims)
    assert [claim.step for claim in claims] == sorted({claim.step for claim in claims})  # each step once, in order
    assert [claim.counts for claim in claims] == sorted((c.counts for c in claims), reverse=True)  # counted first


def test_a_queue_whose_claim_came_back_short_is_not_asked_again_in_the_same_commit() -> None:
    # One job ready, two free slots and room ahead: one statement (the counted claim finds it and runs dry).
    claims, counted, ahead = run(plan_claim([6], 6, 2), [1])
    assert (counted, ahead) == ([1], [0])
    assert [(claim.queue, claim.counts) for claim in claims] == [(0, True)]
    # The dry queue is passed over, the other queue still claims ahead; a full claim leaves its queue asked.
    claims, counted, ahead = run(plan_claim([2, 2], 8, 2), [1, 9])
    assert (counted, ahead) == ([1, 1], [0, 2])
    assert [(claim.queue, claim.counts) for claim in claims] == [(0, True), (1, True), (1, False)]


@pytest.mark.parametrize(
    ("wants", "total", "sweep"),
    [([3], None, True), ([3], 1, True), ([3], 0, False), ([0, 0], 5, False), ([], None, False)],
)
def test_the_sweep_runs_when_a_claim_may_take_a_job(wants: list[int], total: int | None, sweep: bool) -> None:
    assert plan_claim(wants, total, None).sweep is sweep


@pytest.mark.parametrize("late_share", [0.0, 0.2])
def test_claimed_rows_in_claim_order_are_sorted_as_by_claim_rank(late_share: float) -> None:
    # Rows as a claim returns them: (seq, body, priority, …, packed rank last); few distinct priorities and ready
    # times, so that ties fall to the next key, and ready times at both ends of what a store may hold.
    draw = random.Random(7)
    times = [0, 1, 2, TIME_MAX_MS + MAX_TTL_MS - 1, TIME_MAX_MS + MAX_TTL_MS]
    for _batch in range(200):
        drawn = [
            (
                seq,
                draw.choice([MIN_PRIORITY, -5, 0, 0, 3, MAX_PRIORITY]),
                draw.choice(times),
                draw.random() < late_share,
            )
            for seq in draw.sample(range(1000), draw.randrange(0, 40))
        ]
        rows = [(seq, "body", priority, packed_rank(priority, ready, late)) for seq, priority, ready, late in drawn]
        ranks = {seq: claim_rank(priority, ready, seq, late) for seq, priority, ready, late in drawn}
        expected = sorted(rows, key=lambda row: ranks[row[0]])
        assert in_claim_order(list(rows)) == expected


def test_the_claim_plan_phases_say_what_counts_and_the_budgets() -> None:
    assert plan_claim([2], 5, None).phases == ((True, 5),)
    assert plan_claim([2], 5, 1).phases == ((True, 1), (False, 5))
    assert plan_claim([2], None, None).phases == ((True, None),)


# -- the finish plan -----------------------------------------------------------------------------------------


def held_finish(
    seq: int,
    outcome: str,
    *,
    attempt: int = 1,
    counted: bool = True,
    max_attempts: int = 3,
    error: ErrorText | None = None,
    result: StoredResult | None = None,
) -> Finish:
    """A finish of job ``seq`` (token ``seq`` too) on the claim's snapshot, owner ``w1``."""
    fence = Fence("w1", seq, attempt, NOW + 1_000)
    held = Held(seq, max_attempts, NOW + 60_000)
    return Finish(f"job-{seq}", fence, outcome, 0, held, error, counted, result)


# outcome, attempt, counted, max_attempts -> (status, reason, counts), attempt kept
FINISHES = [
    pytest.param("ok", 1, True, 3, ("done", None, 0), 1, id="ok"),
    pytest.param("retry", 1, True, 3, ("pending", "retry", 0), 1, id="retry"),
    pytest.param("retry", 3, True, 3, ("dead", "exhausted", 0), 3, id="exhausted"),
    pytest.param("permanent", 2, True, 3, ("dead", "permanent", 0), 2, id="permanent"),
    pytest.param("retry", 0, False, 3, ("pending", "retry", 1), 1, id="claimed-ahead-counts-its-attempt"),
    pytest.param("retry", 2, False, 3, ("dead", "exhausted", 1), 3, id="claimed-ahead-last-attempt"),
]


@pytest.mark.parametrize(("outcome", "attempt", "counted", "max_attempts", "change", "kept_attempt"), FINISHES)
def test_a_finish_is_decided_as_one_change_and_row_and_keeps_the_attempt_it_ends(
    outcome: str, attempt: int, counted: bool, max_attempts: int, change: tuple[object, ...], kept_attempt: int
) -> None:
    item = held_finish(7, outcome, attempt=attempt, counted=counted, max_attempts=max_attempts)
    assert item.held is not None
    decided = decide_row(item, 7, snapshot(item.fence, item.held), NOW)
    assert decided is not None
    got, row = decided
    assert (got.status, got.reason, got.counts) == change and got.owner == "w1"
    assert row == FinishRow(7, "job-7", 7, attempt, NOW + 1_000, max_attempts, NOW + 60_000)
    assert attempt_after(got, row) == kept_attempt


@pytest.mark.parametrize(
    "state",
    [
        pytest.param(JobState(LEASED, 1, 3, 8, "w1", NOW + 1_000, NOW + 60_000), id="another-token"),
        pytest.param(JobState(LEASED, 1, 3, 7, "w2", NOW + 1_000, NOW + 60_000), id="another-owner"),
        pytest.param(JobState(LEASED, 1, 3, 7, "w1", NOW, NOW + 60_000), id="lease-expired"),
        pytest.param(JobState("done", 1, 3, 7, None, None, NOW + 60_000), id="finished"),
    ],
)
def test_a_finish_on_a_row_it_no_longer_holds_is_stale(state: JobState) -> None:
    assert decide_row(held_finish(7, "ok"), 7, state, NOW) is None


def test_the_held_plan_groups_rows_by_change_in_the_batchs_order_and_leaves_stale_ones_out() -> None:
    items = [
        held_finish(1, "ok"),
        held_finish(2, "ok", attempt=0, counted=False),
        held_finish(3, "ok"),
        held_finish(4, "ok")._replace(fence=Fence("w1", 4, 1, NOW)),  # its lease has expired: stale
        held_finish(5, "retry", error=BOOM),
    ]
    plan = plan_held(items, NOW)
    assert {change: [position for position, _row in rows] for change, rows in plan.items()} == {
        FinishChange("done", None, NOW, 0, "w1"): [0, 2],
        FinishChange("done", None, NOW, 1, "w1"): [1],
        FinishChange("pending", "retry", NOW, 0, "w1"): [4],
    }
    landed = {1, 2, 5}  # job 3's compare-and-set did not land (its row changed under it)
    found = statuses_after(plan, landed, len(items))
    assert found == ["done", "done", None, None, "pending"]
    assert kept(items, plan, found) == ([(5, 1, BOOM)], [])


def test_a_held_plan_needs_every_snapshot() -> None:
    with pytest.raises(ValueError, match="no snapshot"):
        plan_held([held_finish(1, "ok")._replace(held=None)], NOW)


def test_only_landed_finishes_keep_their_error_and_only_done_ones_their_result() -> None:
    result = StoredResult('{"n": 1}', 5_000)
    items = [
        held_finish(1, "ok", result=result),
        held_finish(2, "retry", result=result, error=BOOM),  # a retry keeps its error, not a result
        held_finish(3, "ok", result=result),  # did not land
        held_finish(4, "permanent", attempt=0, counted=False, error=BOOM),
    ]
    plan = plan_held(items, NOW)
    found = statuses_after(plan, {1, 2, 4}, len(items))
    assert found == ["done", "pending", None, "dead"]
    errors, results = kept(items, plan, found)
    assert sorted(errors) == [(2, 1, BOOM), (4, 1, BOOM)]
    assert results == [(1, result)]


def test_a_batch_decided_item_by_item_reads_the_rows_it_must_and_a_missing_row_is_stale() -> None:
    snapshotted = held_finish(1, "ok")
    on_row = held_finish(2, "ok")._replace(held=None)
    missing = held_finish(3, "ok")._replace(held=None)
    compared = held_finish(4, "ok")  # named in on_rows (the lab compares its payload): decided on its row
    items = [snapshotted, on_row, missing, compared]
    assert rows_to_read(items, {"job-4"}) == ["job-2", "job-3", "job-4"]
    row_2 = JobState(LEASED, 1, 3, 2, "w1", NOW + 1_000, NOW + 60_000)
    moved_4 = JobState(LEASED, 1, 3, 5, "w1", NOW + 1_000, NOW + 60_000)  # re-claimed since its snapshot
    decided = decide_each(items, {"job-2": (2, row_2), "job-4": (4, moved_4)}, NOW, {"job-4"})
    assert [None if d is None else d[1].seq for d in decided] == [1, 2, None, None]
