"""Priorities on each driver (docs/flow-control.md): higher first, then the time a job became ready, then ``seq``;
a queue's stored ``max_wait`` serves a job ready longer than that before fresher higher-priority work. Time is
the test's: every claim passes its own ``now``."""

from __future__ import annotations

from typing import Any

import pytest

from asyncq.core.claim_plan import claim_rank
from asyncq.core.jobs import JobSpec
from asyncq.errors import Conflict
from asyncq.queue import Queue
from asyncq.store.port.queue import QueueStore

from .support import T0, assert_no_transaction_left, claim, dump, enqueue, expect, new, outcome, stored

pytestmark = pytest.mark.timeout(30)


async def ids(store: QueueStore, now: int, n: int = 10, queue: str = "default") -> list[str]:
    return [ticket.id for ticket in await claim(store, "w1", now, n=n, queue=queue)]


async def test_higher_priority_is_claimed_first_and_kept_on_the_row_and_ticket(store: QueueStore) -> None:
    rows = [new("low", priority=-100), new("zero"), new("high", priority=100), new("mid", priority=7)]
    jobs = await enqueue(store, *rows)
    assert [jobs[row.id] for row in rows] == [stored(row, jobs[row.id].seq) for row in rows]
    assert [jobs[job_id].priority for job_id in ("low", "zero", "high", "mid")] == [-100, 0, 100, 7]
    tickets = await claim(store, "w1", T0, n=10)
    assert [(t.id, t.priority) for t in tickets] == [("high", 100), ("mid", 7), ("zero", 0), ("low", -100)]


async def test_ties_go_to_the_job_ready_first_then_to_the_older_seq(store: QueueStore) -> None:
    await enqueue(
        store,
        new("later", delay_ms=300, priority=1),
        new("first", priority=1),
        new("second", priority=1),
        new("sooner", delay_ms=100, priority=1),
        new("other", priority=0),
    )
    assert await ids(store, T0 + 300) == ["first", "second", "sooner", "later", "other"]


async def test_the_counted_claims_are_the_first_of_the_order_and_a_claim_takes_the_best_n(store: QueueStore) -> None:
    await enqueue(store, *[new(f"j{p + 5}", priority=p) for p in range(-5, 5)])
    statuses, tickets, *_ = await store.settle_and_claim([], T0, "w1", 1_000, [("default", 4)], 4, start_now=2)
    assert statuses == [] and [(t.id, t.counted) for t in tickets] == [
        ("j9", True),
        ("j8", True),
        ("j7", False),
        ("j6", False),
    ]
    assert await ids(store, T0, n=2) == ["j5", "j4"]


async def test_a_retried_job_keeps_its_priority_and_is_ordered_by_its_retry_time(store: QueueStore) -> None:
    await enqueue(store, new("urgent", priority=9), new("a", priority=1), new("b", priority=1))
    [urgent] = await claim(store, "w1", T0)
    assert await store.finish([outcome(urgent, "retry", 50)], T0 + 10) == ["pending"]
    assert await ids(store, T0 + 20) == ["a", "b"]  # urgent is not ready before T0 + 60
    await enqueue(store, new("c", T0 + 30, priority=1))
    assert await ids(store, T0 + 60) == ["urgent", "c"]


async def test_an_expired_lease_is_taken_back_in_priority_order(store: QueueStore) -> None:
    await enqueue(store, new("low", priority=-1), new("high", priority=3))
    assert await ids(store, T0) == ["high", "low"]
    await enqueue(store, new("fresh", T0 + 500, priority=0))
    # Both leases expired: the taken-over jobs rank by priority among the ready ones, low's -1 last.
    assert await ids(store, T0 + 2_000) == ["high", "fresh", "low"]


async def test_max_wait_serves_a_job_waiting_longer_first_oldest_first(store: QueueStore) -> None:
    queue = Queue(store, clock=lambda: T0)
    await enqueue(store, new("old-low", priority=-50), new("older-low", T0 - 100, priority=-60))
    await enqueue(store, new("fresh-high", T0 + 900, priority=50))
    before = await dump(store, T0 + 900)
    entry = await queue.set_max_wait("default", 1.0, note="bound the digest's wait", by="ops")
    assert (entry.action, entry.max_wait_ms, entry.actor, entry.note) == (
        "max_wait",
        1000,
        "ops",
        "bound the digest's wait",
    )
    [settings] = await store.queue_settings()
    assert (settings.queue, settings.max_wait_ms, settings.paused) == ("default", 1000, False)
    expect(before, await dump(store, T0 + 900), queues=[settings], queue_audit=[entry])
    # At T0 + 900 only older-low (ready since T0 - 100) has waited 1 s: it goes first, then priorities.
    assert await ids(store, T0 + 900, n=1) == ["older-low"]
    assert await ids(store, T0 + 900, n=1) == ["fresh-high"]
    assert await ids(store, T0 + 1_000) == ["old-low"]


async def test_late_jobs_come_before_priorities_in_one_claim_and_a_cleared_max_wait_is_strict(
    store: QueueStore,
) -> None:
    queue = Queue(store, clock=lambda: T0)
    await enqueue(store, new("late-b", priority=-2), new("late-a", T0 - 1, priority=-9), new("top", T0 + 5, priority=9))
    await queue.set_max_wait("default", 0.005)
    tickets = await claim(store, "w1", T0 + 5, n=10)
    assert [t.id for t in tickets] == ["late-a", "late-b", "top"]
    await enqueue(store, new("x", T0 + 10, priority=-1), new("y", T0 + 10, priority=1))
    await queue.set_max_wait("default", None)
    # Every job waited long (the first three's leases expired too), but without a max_wait priorities are strict.
    assert await ids(store, T0 + 50_000) == ["top", "y", "x", "late-b", "late-a"]


def test_the_claim_rank_is_the_documented_order() -> None:
    ranked = sorted(
        [("p1", 1, 20, 3, False), ("p5", 5, 30, 4, False), ("late", -9, 10, 9, True), ("p1-old", 1, 10, 8, False)],
        key=lambda r: claim_rank(r[1], r[2], r[3], r[4]),
    )
    assert [r[0] for r in ranked] == ["late", "p5", "p1-old", "p1"]


BAD_PRIORITIES: list[tuple[Any, type[Exception]]] = [
    (True, TypeError),
    (False, TypeError),
    (1.0, TypeError),
    ("5", TypeError),
    (None, TypeError),
    (101, ValueError),
    (-101, ValueError),
    (2**63, ValueError),
]


@pytest.mark.parametrize(("priority", "error"), BAD_PRIORITIES)
async def test_a_bad_priority_is_refused_before_any_statement(
    store: QueueStore, priority: Any, error: type[Exception]
) -> None:
    queue = Queue(store, clock=lambda: T0)
    await queue.enqueue("kept", {"v": 1}, priority=3)
    before = await dump(store)
    with pytest.raises(error, match="priority"):
        await queue.enqueue("new", {}, priority=priority)
    with pytest.raises(error, match="priority"):
        await queue.enqueue_many([JobSpec("new-1", {}), JobSpec("new-2", {}, priority=priority)])
    with pytest.raises(error, match="priority"):
        async with queue.transaction() as tx:
            await tx.enqueue("new-3", {}, priority=priority)
    assert await dump(store) == before
    await assert_no_transaction_left(store)


async def test_the_same_id_with_another_priority_is_a_conflict(store: QueueStore) -> None:
    queue = Queue(store, clock=lambda: T0)
    assert await queue.enqueue("job", {"v": 1}, priority=3) is True
    assert await queue.enqueue("job", {"v": 1}, priority=3) is False
    before = await dump(store)
    with pytest.raises(Conflict):
        await queue.enqueue("job", {"v": 1}, priority=4)
    assert await dump(store) == before


async def test_an_expired_lease_that_waited_past_max_wait_is_taken_back_first(store: QueueStore) -> None:
    await enqueue(store, new("late-low", priority=-9), new("fresh-high", T0 + 100, priority=9))
    assert await ids(store, T0 + 100) == ["fresh-high", "late-low"]  # both leased, both leases end at T0 + 1100
    await Queue(store, clock=lambda: T0).set_max_wait("default", 1.0)
    # At T0 + 1100 both leases have expired and both jobs have waited max_wait or longer (ready at T0 and T0 + 100):
    # late jobs go oldest first whatever their priority, so one claim of one takes late-low.
    assert await ids(store, T0 + 1_050, n=1) == []
    assert await ids(store, T0 + 1_100, n=1) == ["late-low"]
    assert await ids(store, T0 + 1_100, n=1) == ["fresh-high"]
