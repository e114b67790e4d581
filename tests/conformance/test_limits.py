"""Concurrency and rate limits on each driver (docs/flow-control.md, "Limits"): the claim counts a queue's live
leases (of the queue, and of each limit key) and advances its rate's stored state in its own transaction; a job a
limit holds is not claimed, spends no attempt and keeps its place and priority; an expired lease frees its slot by
itself; a limited queue is never claimed ahead; every ``set_limits`` is audited; bad input changes nothing."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest
from drivers import Driver

from asyncq.core.flow_limits import Hold, Limits, LimitUsage
from asyncq.core.jobs import Job, Ticket
from asyncq.errors import Conflict
from asyncq.queue import Queue
from asyncq.store.port.queue import QueueStore

from .support import T0, assert_no_transaction_left, claim, dump, enqueue, expect, new, outcome

pytestmark = pytest.mark.timeout(60)

LEASE = 1_000


def facade(store: QueueStore, now: int = T0) -> Queue:
    return Queue(store, clock=lambda: now)


async def held(
    store: QueueStore, now: int, queue: str = "mail", n: int = 10, lease: int = LEASE
) -> tuple[list[Ticket], tuple[Hold, ...]]:
    """A claim of up to ``n`` jobs for free slots: what it took and what held the queue."""
    settled = await store.settle_and_claim([], now, "w1", lease, [(queue, n)], None)
    return settled.tickets, settled.holds


def ids(tickets: list[Ticket]) -> list[str]:
    return [ticket.id for ticket in tickets]


def leased(job: Job, ticket: Ticket) -> Job:
    """``job`` as a claim at ``ticket``'s fence leaves it (its attempt counted)."""
    fence = ticket.fence
    return replace(job, status="leased", attempts=fence.attempt, token=fence.token, owner=fence.owner,
                   lease_until=fence.lease_until)  # fmt: skip


async def test_a_queue_runs_at_most_its_concurrency_and_a_held_job_spends_nothing(store: QueueStore) -> None:
    jobs = await enqueue(store, *[new(f"m{n}", queue="mail") for n in range(5)], new("o1", queue="other"))
    await facade(store).set_limits("mail", concurrency=2, note="provider allows two", by="ops")
    before = await dump(store)
    taken, holds = await held(store, T0)
    assert ids(taken) == ["m0", "m1"] and holds == ()
    assert ids(await claim(store, "w2", T0 + 1, queue="other")) == ["o1"]  # other queues are not limited
    again, holds = await held(store, T0 + 2)
    assert again == [] and holds == (Hold("mail", T0 + LEASE, False),)  # until the first lease may expire
    after = await dump(store)
    changed = {t.id: leased(jobs[t.id], t) for t in taken} | {"o1": after.jobs["o1"]}
    expect(before, after, changed)  # the held jobs are as they were: pending, no attempt spent, same priority
    assert await store.finish([outcome(taken[0], "ok")], T0 + 3) == ["done"]
    freed, holds = await held(store, T0 + 4)
    assert ids(freed) == ["m2"] and holds == ()


async def test_an_expired_lease_frees_its_slot_by_itself(store: QueueStore) -> None:
    await enqueue(store, new("a", queue="mail"), new("b", queue="mail", priority=-1))
    await facade(store).set_limits("mail", concurrency=1)
    [first], _ = await held(store, T0)
    assert first.id == "a"
    assert (await held(store, T0 + LEASE - 1))[0] == []  # the holder may still be running
    # Its holder died (SIGKILL): nothing counts it once its lease is over, and the claim order is as ever: the
    # expired lease of "a" (priority 0) comes before "b" (priority -1), with a new token.
    [again], holds = await held(store, T0 + LEASE)
    assert (again.id, again.token, again.attempt, holds) == ("a", first.token + 1, 2, ())
    assert (await held(store, T0 + LEASE + 1))[0] == []
    [last], _ = await held(store, T0 + 2 * LEASE)
    assert last.id == "a"  # "a" is still the best; "b" waits its turn


async def test_a_key_at_its_limit_is_stepped_over_and_other_keys_run(store: QueueStore) -> None:
    rows = [new(f"a{n}", queue="mail", limit_key="tenant-a", priority=9) for n in range(4)]
    rows += [new("b0", queue="mail", limit_key="tenant-b", priority=1), new("b1", queue="mail", limit_key="tenant-b")]
    rows += [new("free", queue="mail", priority=-5)]  # no key: the per-key limit does not bind it
    await enqueue(store, *rows)
    await facade(store).set_limits("mail", per_key_concurrency=1)
    taken, holds = await held(store, T0, n=10)
    assert ids(taken) == ["a0", "b0", "free"] and holds == ()  # one of each key, in the claim order
    nothing, holds = await held(store, T0 + 1)
    assert nothing == [] and holds == (Hold("mail", T0 + LEASE, False),)
    assert await store.finish([outcome(taken[0], "ok")], T0 + 2) == ["done"]
    assert ids((await held(store, T0 + 3))[0]) == ["a1"]  # tenant-a's next, still before tenant-b's second
    usage = await facade(store, T0 + 4).limits()
    assert usage == [LimitUsage("mail", Limits(per_key_concurrency=1), 3, 2, 2, None)]


async def test_a_full_key_with_many_jobs_ahead_does_not_block_the_keys_behind_it(store: QueueStore) -> None:
    await enqueue(store, *[new(f"big{n}", queue="mail", limit_key="big", priority=5) for n in range(40)])
    await enqueue(store, new("small", queue="mail", limit_key="small", priority=-5))
    await facade(store).set_limits("mail", concurrency=3, per_key_concurrency=2)
    taken, _ = await held(store, T0, n=10)
    assert ids(taken) == ["big0", "big1", "small"]  # the queue's 3 slots: 2 for big, then small's behind 38 more


async def test_keys_behind_a_full_keys_backlog_deeper_than_the_claims_window_are_found_by_key(
    store: QueueStore,
) -> None:
    """A full key's backlog fills the window the claim reads of the queue's order (``core.flow_limits.claim_window``):
    the other keys' best jobs are found by one seek a key, with the per-key limit and the claim order kept."""
    await enqueue(store, *[new(f"big{n:03d}", queue="mail", limit_key="big", priority=9) for n in range(300)])
    rows = [new(f"c{k}-{n}", queue="mail", limit_key=f"c{k}", priority=k) for k in range(5) for n in range(3)]
    await enqueue(store, *rows)
    await facade(store).set_limits("mail", per_key_concurrency=2)
    taken, _ = await held(store, T0, n=9)
    assert ids(taken) == ["big000", "big001", "c4-0", "c4-1", "c3-0", "c3-1", "c2-0", "c2-1", "c1-0"]
    nothing, holds = await held(store, T0 + 1, n=9)
    assert [t.id for t in nothing] == ["c1-1", "c0-0", "c0-1"]  # what is left with room: c1 one, c0 two
    nothing, holds = await held(store, T0 + 2, n=9)
    assert nothing == [] and holds == (Hold("mail", T0 + LEASE, False),)  # every key at its limit
    finished = next(t for t in taken if t.id == "c3-0")
    assert await store.finish([outcome(finished, "ok")], T0 + 3) == ["done"]
    assert ids((await held(store, T0 + 4, n=9))[0]) == ["c3-2"]  # c3's slot freed: its next job, found by its key


async def test_priorities_hold_among_limited_jobs_as_slots_free(store: QueueStore) -> None:
    await enqueue(store, *[new(f"j{n}", queue="mail", priority=p) for n, p in enumerate((-1, 5, 3, 0, 5))])
    await facade(store).set_limits("mail", concurrency=1)
    order = []
    now = T0
    for _ in range(5):
        [ticket], _holds = await held(store, now)
        order.append(ticket.id)
        assert (await held(store, now + 1))[0] == []  # held: the others wait, with their priorities
        assert await store.finish([outcome(ticket, "ok")], now + 2) == ["done"]
        now += 10
    assert order == ["j1", "j4", "j2", "j3", "j0"]  # claim_rank's order: priority, then ready time, then seq


async def test_a_rate_lets_jobs_start_at_its_pace_as_the_clock_moves(store: QueueStore, driver: Driver) -> None:
    await enqueue(store, *[new(f"r{n}", queue="mail") for n in range(6)])
    await facade(store).set_limits("mail", rate=2, per=1.0)  # one job every 500 ms, none at once beyond it
    assert ids((await held(store, T0))[0]) == ["r0"]
    nothing, holds = await held(store, T0 + 499)
    assert nothing == [] and holds == (Hold("mail", T0 + 500, True),)
    other = await driver.open_another(store)  # the rate's state is a row: another handle (host) sees it
    try:
        assert (await held(other, T0 + 499))[0] == []
        assert ids((await held(other, T0 + 500))[0]) == ["r1"]
    finally:
        await other.close()
    # Idle for a while, then a burst of 1: missed slots are not saved up.
    assert ids((await held(store, T0 + 5_000, lease=60_000))[0]) == ["r0"]  # its lease expired: taken again
    assert (await held(store, T0 + 5_499))[0] == []
    assert ids((await held(store, T0 + 5_500, lease=60_000))[0]) == ["r1"]


async def test_a_burst_starts_that_many_at_once_then_the_rate_paces_them(store: QueueStore) -> None:
    await enqueue(store, *[new(f"r{n}", queue="mail") for n in range(10)])
    await facade(store).set_limits("mail", rate=10, per=timedelta(seconds=1), burst=3)
    assert ids((await held(store, T0))[0]) == ["r0", "r1", "r2"]
    assert (await held(store, T0 + 99))[1] == (Hold("mail", T0 + 100, True),)
    assert ids((await held(store, T0 + 100))[0]) == ["r3"]
    assert ids((await held(store, T0 + 350))[0]) == ["r4", "r5"]  # 250 ms later: two more intervals
    usage = (await facade(store, T0 + 350).limits())[0]
    assert (usage.slots_used, usage.rate_next_ms) == (6, T0 + 400)


async def test_a_rate_and_a_concurrency_together_take_the_least_they_allow(store: QueueStore) -> None:
    await enqueue(store, *[new(f"j{n}", queue="mail") for n in range(10)])
    await facade(store).set_limits("mail", concurrency=2, rate=100, per=1.0, burst=5)
    taken, _ = await held(store, T0)
    assert len(taken) == 2  # the slots, though the burst allows 5
    assert (await held(store, T0 + 1))[1] == (Hold("mail", T0 + LEASE, False),)


async def test_a_limited_queue_is_never_claimed_ahead(store: QueueStore) -> None:
    await enqueue(
        store, *[new(f"m{n}", queue="mail") for n in range(8)], *[new(f"o{n}", queue="other") for n in range(8)]
    )
    await facade(store).set_limits("mail", concurrency=5)
    settled = await store.settle_and_claim([], T0, "w1", LEASE, [("mail", 6), ("other", 6)], 6, start_now=2)
    counted = [(t.queue, t.counted) for t in settled.tickets]
    assert counted == [("mail", True), ("mail", True), ("other", False), ("other", False), ("other", False),
                       ("other", False)]  # fmt: skip
    # No free slot at all: the limited queue gets nothing, the unlimited one is claimed ahead.
    settled = await store.settle_and_claim([], T0 + 1, "w1", LEASE, [("mail", 4), ("other", 4)], 4, start_now=0)
    assert [(t.queue, t.counted) for t in settled.tickets] == [("other", False)] * 4


async def test_set_limits_is_stored_audited_and_none_clears_it(store: QueueStore, driver: Driver) -> None:
    await enqueue(store, *[new(f"m{n}", queue="mail") for n in range(4)])
    queue = facade(store)
    before = await dump(store)
    entry = await queue.set_limits("mail", concurrency=3, per_key_concurrency=1, rate=100, per=60.0, burst=2,
                                   note="provider allows 100 a minute", by="ops on call")  # fmt: skip
    assert (entry.queue, entry.action, entry.actor, entry.note, entry.limits) == (
        "mail", "limits", "ops on call", "provider allows 100 a minute", Limits(3, 1, 100, 60_000, 2)
    )  # fmt: skip
    after = await dump(store)
    [settings] = after.queues
    assert settings.limits == Limits(3, 1, 100, 60_000, 2) and not settings.paused
    expect(before, after, queue_audit=[entry], queues=[settings])
    other = await driver.open_another(store)  # stored: a restart or another host sees it
    try:
        assert [each.limits for each in await other.queue_settings()] == [Limits(3, 1, 100, 60_000, 2)]
    finally:
        await other.close()
    cleared = await queue.set_limits("mail")
    assert cleared.limits == Limits() and cleared.note == "limits none"
    assert [each.limits for each in await queue.queue_settings()] == [Limits()]
    assert ids((await held(store, T0))[0]) == ["m0", "m1", "m2", "m3"]  # the plain claim again
    assert await queue.limits() == []
    assert [m.action for m in await queue.queue_audit("mail")] == ["limits", "limits"]


async def test_a_paused_limited_queue_gives_nothing_and_resumes_within_its_limits(store: QueueStore) -> None:
    await enqueue(store, *[new(f"m{n}", queue="mail") for n in range(4)])
    queue = facade(store)
    await queue.set_limits("mail", concurrency=2)
    await queue.pause("mail", note="outage")
    assert await held(store, T0) == ([], ())
    await queue.resume("mail", note="back")
    assert len((await held(store, T0))[0]) == 2


async def test_the_same_limits_again_keep_the_rate_and_a_faster_rate_waits_at_most_one_interval(
    store: QueueStore,
) -> None:
    await enqueue(store, *[new(f"r{n}", queue="mail") for n in range(5)])
    queue = facade(store)
    await queue.set_limits("mail", rate=1, per=60.0)
    assert len((await held(store, T0))[0]) == 1
    await queue.set_limits("mail", rate=1, per=60.0, note="again")  # re-applied: no job slips in
    assert (await held(store, T0 + 59_999))[1] == (Hold("mail", T0 + 60_000, True),)
    await facade(store, T0 + 1_000).set_limits("mail", rate=10, per=1.0)  # faster: one new interval at most
    assert (await held(store, T0 + 1_099))[0] == []
    assert len((await held(store, T0 + 1_100))[0]) == 1


async def test_the_limit_key_is_part_of_the_job(store: QueueStore) -> None:
    jobs = await enqueue(store, new("k", queue="mail", limit_key="tenant-7"))
    assert jobs["k"].limit_key == "tenant-7"
    assert await store.enqueue([new("k", queue="mail", limit_key="tenant-7")]) == [False]
    before = await dump(store)
    with pytest.raises(Conflict):
        await store.enqueue([new("k", queue="mail", limit_key="tenant-8")])
    with pytest.raises(Conflict):
        await store.enqueue([new("k", queue="mail")])
    assert await dump(store) == before


BAD_LIMITS: list[tuple[dict[str, Any], type[Exception]]] = [
    ({"concurrency": 0}, ValueError),
    ({"concurrency": -1}, ValueError),
    ({"concurrency": 100_001}, ValueError),
    ({"concurrency": True}, TypeError),
    ({"concurrency": 2.0}, TypeError),
    ({"concurrency": "2"}, TypeError),
    ({"per_key_concurrency": 0}, ValueError),
    ({"per_key_concurrency": False}, TypeError),
    ({"rate": 0}, ValueError),
    ({"rate": 1_000_001}, ValueError),
    ({"rate": 1.5}, TypeError),
    ({"rate": True}, TypeError),
    ({"rate": 10, "per": 0}, ValueError),
    ({"rate": 10, "per": -1.0}, ValueError),
    ({"rate": 10, "per": float("nan")}, ValueError),
    ({"rate": 10, "per": 366 * 86_400}, ValueError),
    ({"rate": 10, "per": "60s"}, TypeError),
    ({"rate": 10, "per": True}, TypeError),
    ({"rate": 10_000, "per": 0.001}, ValueError),  # more than one job a microsecond
    ({"rate": 10, "burst": 0}, ValueError),
    ({"rate": 10, "burst": 11}, ValueError),
    ({"rate": 10, "burst": 2.0}, TypeError),
    ({"per": 1.0}, ValueError),  # a period without a rate
    ({"burst": 2}, ValueError),
    ({"concurrency": 2, "note": ""}, ValueError),
    ({"concurrency": 2, "note": "line\nbreak"}, ValueError),
    ({"concurrency": 2, "by": " padded"}, ValueError),
]


@pytest.mark.parametrize(("options", "error"), BAD_LIMITS)
async def test_bad_limits_are_refused_before_any_statement(
    store: QueueStore, options: dict[str, Any], error: type[Exception]
) -> None:
    queue = facade(store)
    await queue.set_limits("mail", concurrency=4, note="kept")
    before = await dump(store)
    with pytest.raises(error):
        await queue.set_limits("mail", **options)
    with pytest.raises(ValueError):
        await queue.set_limits("bad queue", concurrency=2)
    assert await dump(store) == before
    await assert_no_transaction_left(store)


@pytest.mark.parametrize(
    ("limit_key", "error"),
    [("", ValueError), (" tenant", ValueError), ("a\nb", ValueError), ("x" * 201, ValueError), (7, TypeError)],
)
async def test_a_bad_limit_key_is_refused_before_any_statement(
    store: QueueStore, limit_key: object, error: type[Exception]
) -> None:
    queue = facade(store)
    before = await dump(store)
    with pytest.raises(error):
        await queue.enqueue("bad", {}, queue="mail", limit_key=limit_key)  # type: ignore[arg-type]
    assert await dump(store) == before
    await assert_no_transaction_left(store)
