"""Schedules as stored state on each driver (docs/schedules.md): one job per tick however many handles evaluate and
however their clocks stand, the ``missed`` and ``overlap`` policies with a moved clock, pause and resume, retirement
and revival, run now, retention that never removes what an overlap check needs, and bad input refused before any
statement. Every test reads the whole state back through the port: the schedules, their events and the jobs."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import pytest
from drivers import Driver

from asyncq.core.schedules import (
    KEPT_TICK_EVENTS,
    MAX_CATCH_UP,
    MAX_TICK_EVENTS,
    Schedule,
    ScheduleEvent,
    ScheduleSpec,
    schedule_job_id,
)
from asyncq.queue import Queue
from asyncq.store.port.queue import JobFilter, QueueStore

from .support import T0, assert_no_transaction_left, claim, outcome

pytestmark = pytest.mark.timeout(60)

S = 1000


class Clock:
    def __init__(self, offset_ms: int = 0, start: list[int] | None = None) -> None:
        self.shared = start if start is not None else [T0]
        self.offset = offset_ms

    def __call__(self) -> int:
        return self.shared[0] + self.offset

    def move(self, ms: int) -> int:
        self.shared[0] += ms
        return self()


def every(name: str = "beat", seconds: float = 10, **fields: Any) -> ScheduleSpec:
    return ScheduleSpec(name, {"schedule": name}, every=seconds, **fields)


@dataclass(frozen=True)
class State:
    schedules: dict[str, Schedule]
    events: list[ScheduleEvent]
    jobs: dict[str, str]  # id -> status


async def state(queue: Queue) -> State:
    listed = await queue.store.list_jobs(JobFilter(limit=10_000, body=False))
    events = list(reversed(await queue.schedule_events(limit=1000)))
    return State({s.name: s for s in await queue.schedules()}, events, {job.id: job.status for job in listed})


def of(jobs: dict[str, str], name: str) -> set[str]:
    """The ids of ``name``'s tick jobs."""
    return {job for job in jobs if job.startswith(f"sch-{name}-") and job[len(name) + 5 :].isdigit()}


def ticks(*seconds: int, name: str = "beat") -> set[str]:
    return {schedule_job_id(name, T0 + n * S) for n in seconds}


def kinds(events: list[ScheduleEvent], name: str = "beat", moves: bool = True) -> list[tuple[str, int | None]]:
    """``(kind, tick in seconds from T0)`` of ``name``'s events, oldest first (without the moves, unless ``moves``)."""
    return [
        (e.kind, None if e.tick_ms is None else (e.tick_ms - T0) // S)
        for e in events
        if e.schedule == name and (moves or e.skipped_tick)
    ]


# -- one job per tick ----------------------------------------------------------------------------------------------


async def test_two_handles_racing_each_evaluation_make_one_job_per_tick(store: QueueStore, driver: Driver) -> None:
    clock = Clock()
    first = Queue(store, clock=clock)
    await first.declare_schedules([every(overlap="allow")])
    other = await driver.open_another(store)
    try:
        second = Queue(other, clock=clock)
        for _ in range(6):
            clock.move(10 * S)
            runs = await asyncio.gather(first.run_schedules(), second.run_schedules())
            assert sum(len(run.jobs) for run in runs) == 1, runs  # whichever won, one job
        # The port itself: both read the same revision, both try it; one writes.
        clock.move(10 * S)
        [seen] = await store.live_schedules()
        done = await asyncio.gather(*(handle.advance_schedule("beat", seen.schedule.revision, clock()) for handle in
                                      (store, other)))  # fmt: skip
        assert sorted(d is None for d in done) == [False, True]
    finally:
        await other.close()
    found = await state(first)
    assert set(found.jobs) == ticks(10, 20, 30, 40, 50, 60, 70)
    assert (found.schedules["beat"].ticks_fired, found.schedules["beat"].last_tick) == (7, T0 + 70 * S)


async def test_clocks_ahead_and_behind_never_fire_a_tick_twice_nor_lose_one(store: QueueStore, driver: Driver) -> None:
    shared = [T0]
    ahead, behind = Clock(7 * S, shared), Clock(-13 * S, shared)
    other = await driver.open_another(store)
    try:
        fast, slow = Queue(store, clock=ahead), Queue(other, clock=behind)
        await slow.declare_schedules([every(overlap="allow")])  # declared on the slow clock: ticks from T0 - 13 s
        for step in range(12):
            ahead.move(4 * S)
            await (fast if step % 3 else slow).run_schedules()
            await (slow if step % 3 else fast).run_schedules()
        found = await state(fast)
    finally:
        await other.close()
    fired = sorted(found.jobs)
    grid = {schedule_job_id("beat", T0 - 13 * S + n * 10 * S) for n in range(1, 7)}
    missed = {schedule_job_id("beat", e.tick_ms) for e in found.events if e.tick_ms is not None}
    assert set(fired) | missed == grid and not set(fired) & missed  # every tick once: a job or an event
    assert found.schedules["beat"].last_tick == T0 - 13 * S + 60 * S  # ahead's clock at T0 + 55 s


# -- missed --------------------------------------------------------------------------------------------------------


async def test_after_downtime_missed_latest_skip_and_all_decide_the_due_ticks(store: QueueStore) -> None:
    clock = Clock()
    queue = Queue(store, clock=clock)
    specs = [every("latest"), every("skip", missed="skip"), every("all", missed="all", overlap="allow"),
             every("allskip", missed="all"), every("late", 120, missed="skip")]  # fmt: skip
    await queue.declare_schedules(specs)
    clock.move(105 * S)  # ten ticks of the ten-second schedules came due; "late" one tick, 105 - 120 ... not yet
    clock.move(90 * S)  # now 195 s: "late" ticked at 120 s, 75 s ago: more than its minute of grace
    run = await queue.run_schedules()
    found = await state(queue)
    nineteen = list(range(10, 200, 10))
    assert of(found.jobs, "latest") == ticks(190, name="latest")
    assert kinds(found.events, "latest", moves=False) == [("missed", n) for n in nineteen[:-1]]
    assert of(found.jobs, "skip") == ticks(190, name="skip")  # 5 s late: within its grace
    assert of(found.jobs, "all") == ticks(*nineteen, name="all")
    assert of(found.jobs, "allskip") == ticks(10, name="allskip")  # the first runs; it is pending
    assert kinds(found.events, "allskip", moves=False) == [("overlap", n) for n in nineteen[1:]]
    assert kinds(found.events, "late", moves=False) == [("missed", 120)] and not of(found.jobs, "late")
    assert (run.missed, run.skipped, len(run.jobs)) == (18 + 18 + 1, 18, 1 + 1 + 19 + 1)
    latest = found.schedules["latest"]
    assert (latest.ticks_fired, latest.ticks_missed, latest.next_tick) == (1, 18, T0 + 200 * S)


async def test_a_long_downtime_is_bounded_and_counted_exactly(store: QueueStore) -> None:
    clock = Clock()
    queue = Queue(store, clock=clock)
    await queue.declare_schedules([every("all", 1, missed="all", overlap="allow"), every("latest", 1)])
    clock.move(3600 * S)  # an hour of one-second ticks
    run = await queue.run_schedules()
    found = await state(queue)
    assert len(of(found.jobs, "all")) == MAX_CATCH_UP
    assert of(found.jobs, "latest") == ticks(3600, name="latest")
    for name, runs in (("all", MAX_CATCH_UP), ("latest", 1)):
        events = [e for e in found.events if e.schedule == name and e.skipped_tick]
        assert len(events) == MAX_TICK_EVENTS + 1 and all(e.kind == "missed" for e in events)
        assert sum(e.ticks for e in events) == 3600 - runs == found.schedules[name].ticks_missed
        assert (events[-1].tick_ms, events[-1].through_ms) == (T0 + (MAX_TICK_EVENTS + 1) * S, T0 + (3600 - runs) * S)
    assert run.missed == 2 * 3600 - MAX_CATCH_UP - 1


# -- overlap -------------------------------------------------------------------------------------------------------


async def test_overlap_skip_waits_for_the_previous_run_to_end_or_its_lease_to_expire(store: QueueStore) -> None:
    clock = Clock()
    queue = Queue(store, clock=clock)
    await queue.declare_schedules([every()])
    clock.move(10 * S)
    assert (await queue.run_schedules()).jobs == (schedule_job_id("beat", T0 + 10 * S),)
    clock.move(10 * S)
    assert (await queue.run_schedules()).skipped == 1  # pending
    [ticket] = await claim(store, "w1", clock(), lease_ms=15 * S)
    clock.move(10 * S)
    assert (await queue.run_schedules()).skipped == 1  # leased, live
    clock.move(10 * S)
    assert len((await queue.run_schedules()).jobs) == 1  # its lease expired at 35 s: not running
    assert await store.finish([outcome(ticket, "ok")], clock()) == [None]  # the stale holder's finish is refused
    found = await state(queue)
    assert set(found.jobs) == ticks(10, 40)
    assert kinds(found.events) == [("declared", None), ("overlap", 20), ("overlap", 30)]
    claimed = await claim(store, "w2", clock(), n=5)  # 40 s's job, and 10 s's again: its lease expired
    assert sorted(t.id for t in claimed) == sorted(ticks(10, 40))
    await store.finish([outcome(ticket, "ok") for ticket in claimed], clock())
    clock.move(10 * S)
    assert len((await queue.run_schedules()).jobs) == 1  # done: the next tick runs


async def test_queue_one_holds_one_tick_and_runs_it_when_the_previous_run_ends(store: QueueStore) -> None:
    clock = Clock()
    queue = Queue(store, clock=clock)
    await queue.declare_schedules([every(overlap="queue_one")])
    clock.move(10 * S)
    await queue.run_schedules()
    [ticket] = await claim(store, "w1", clock(), lease_ms=60 * S)
    clock.move(10 * S)
    run = await queue.run_schedules()
    assert (run.jobs, run.waiting) == ((), False) and (await queue.schedules())[0].queued_tick == T0 + 20 * S
    clock.move(10 * S)
    assert (await queue.run_schedules()).skipped == 1  # one held already: 30 s is skipped
    assert await store.finish([outcome(ticket, "ok")], clock()) == ["done"]
    clock.move(1 * S)
    assert (await queue.run_schedules()).jobs == (schedule_job_id("beat", T0 + 20 * S),)
    found = await state(queue)
    assert set(found.jobs) == ticks(10, 20) and found.schedules["beat"].queued_tick is None
    assert kinds(found.events) == [("declared", None), ("overlap", 30)]


async def test_a_tick_waiting_in_a_paused_queue_makes_the_next_ones_skip_as_queue_paused(store: QueueStore) -> None:
    clock = Clock()
    queue = Queue(store, clock=clock)
    await queue.declare_schedules([every(queue="mail")])
    await queue.pause("mail", note="provider outage")
    clock.move(20 * S)
    await queue.run_schedules()  # the tick enqueues its job: it waits in the paused queue
    clock.move(10 * S)
    await queue.run_schedules()
    found = await state(queue)
    assert found.jobs == {schedule_job_id("beat", T0 + 20 * S): "pending"}
    assert kinds(found.events) == [("declared", None), ("missed", 10), ("queue_paused", 30)]


# -- pause, retire, run now ----------------------------------------------------------------------------------------


async def test_a_paused_schedule_writes_its_ticks_as_paused_in_every_handle_until_resumed(
    store: QueueStore, driver: Driver
) -> None:
    clock = Clock()
    queue = Queue(store, clock=clock)
    await queue.declare_schedules([every()])
    pause = await queue.pause_schedule("beat", note="maintenance", by="ops")
    assert (pause.kind, pause.actor, pause.note, pause.at_ms) == ("pause", "ops", "maintenance", T0)
    clock.move(25 * S)
    other = await driver.open_another(store)
    try:
        assert (await Queue(other, clock=clock).run_schedules()).jobs == ()  # another handle: paused too
    finally:
        await other.close()
    clock.move(10 * S)  # 30 s came due and nobody evaluated: the resume writes it
    resume = await queue.resume_schedule("beat", note="done", by="ops")
    clock.move(5 * S)
    assert (await queue.run_schedules()).jobs == (schedule_job_id("beat", T0 + 40 * S),)
    found = await state(queue)
    assert kinds(found.events) == [("declared", None), ("pause", None), ("paused", 10), ("paused", 20),
                                   ("paused", 30), ("resume", None)]  # fmt: skip
    assert found.events[-1] == resume and found.schedules["beat"].ticks_skipped == 3
    before = await state(queue)
    with pytest.raises(ValueError, match="not paused"):
        await queue.resume_schedule("beat", note="again")
    await queue.pause_schedule("beat", note="once")
    paused = await state(queue)
    with pytest.raises(ValueError, match="already paused"):
        await queue.pause_schedule("beat", note="twice")
    with pytest.raises(ValueError, match="no schedule named"):
        await queue.pause_schedule("nosuch", note="x")
    assert await state(queue) == paused and len(paused.events) == len(before.events) + 1
    await assert_no_transaction_left(store)


async def test_a_schedule_no_longer_declared_is_retired_and_a_redeclared_one_counts_from_then(
    store: QueueStore,
) -> None:
    clock = Clock()
    queue = Queue(store, clock=clock)
    beat, gone = every(overlap="allow"), every("gone", overlap="allow")
    await queue.declare_schedules([beat, gone, every("elsewhere", queue="mail", overlap="allow")], scope=["default"])
    events = await queue.declare_schedules([beat], scope=["default"])  # "elsewhere" is of another queue
    assert [(e.schedule, e.kind) for e in events] == [("gone", "retired")]
    assert await queue.declare_schedules([beat], scope=["default"]) == []  # the same: nothing written
    clock.move(30 * S)
    run = await queue.run_schedules()
    assert set(run.jobs) == ticks(30) | ticks(30, name="elsewhere")
    with pytest.raises(ValueError, match="retired"):
        await queue.run_schedule_now("gone", note="x")
    revived = await queue.declare_schedules([beat, gone], scope=["default"])
    assert [(e.schedule, e.kind) for e in revived] == [("gone", "declared")]
    clock.move(10 * S)
    assert set((await queue.run_schedules()).jobs) == ticks(40) | ticks(40, name="elsewhere") | ticks(40, name="gone")
    changed = await queue.declare_schedules([every(seconds=15, overlap="allow"), gone])
    assert [(e.schedule, e.kind, e.note) for e in changed] == [("beat", "changed", "every 15s")]
    assert {s.name: s.next_tick for s in await queue.schedules()}["beat"] == T0 + 55 * S  # from now, not 40 s


async def test_run_now_enqueues_a_job_without_moving_the_tick_and_the_next_tick_sees_it(store: QueueStore) -> None:
    clock = Clock()
    queue = Queue(store, clock=clock)
    await queue.declare_schedules([every()])
    clock.move(3 * S)
    event = await queue.run_schedule_now("beat", note="backfill", by="ops")
    assert (event.kind, event.job_id, event.actor) == ("run_now", f"sch-beat-now-{T0 + 3 * S}", "ops")
    found = await state(queue)
    assert found.jobs == {event.job_id: "pending"}
    assert (found.schedules["beat"].last_tick, found.schedules["beat"].next_tick) == (None, T0 + 10 * S)
    clock.move(7 * S)
    assert (await queue.run_schedules()).skipped == 1  # the run now's job is the newest run: still pending


async def test_a_changed_cron_takes_effect_from_its_next_tick_and_dst_holds_in_the_store(store: QueueStore) -> None:
    start = 1_711_800_000_000  # 2024-03-30T12:00:00Z
    clock = Clock(start=[start])
    queue = Queue(store, clock=clock)
    await queue.declare_schedules([ScheduleSpec("nightly", {}, cron="30 2 * * *", tz="Europe/Berlin")])
    clock.move(86_400 * S)  # the spring day: 02:30 does not exist, it fired at 03:00 CEST (01:00Z)
    assert (await queue.run_schedules()).jobs == (schedule_job_id("nightly", 1_711_846_800_000),)
    [schedule] = await queue.schedules()
    assert schedule.next_tick == 1_711_931_400_000  # 2024-04-01T02:30+02:00


# -- retention (issue 29, point 4) ---------------------------------------------------------------------------------


async def test_retention_never_removes_the_run_an_overlap_check_reads(store: QueueStore) -> None:
    clock = Clock()
    queue = Queue(store, clock=clock)
    await queue.declare_schedules([every()])
    await queue.set_retention("default", done=0, dead=0, cancelled=0)
    clock.move(10 * S)
    await queue.run_schedules()
    clock.move(10 * S)
    await queue.apply_retention()
    assert (await queue.run_schedules()).skipped == 1  # its run is pending: kept, and the tick skipped
    [ticket] = await claim(store, "w1", clock())
    await store.finish([outcome(ticket, "ok")], clock())
    clock.move(1 * S)
    removed = await queue.apply_retention()
    assert removed.total == 1 and await queue.get(schedule_job_id("beat", T0 + 10 * S)) is None
    clock.move(9 * S)
    assert (await queue.run_schedules()).jobs == (schedule_job_id("beat", T0 + 30 * S),)  # a removed run: ended


async def test_tick_events_are_kept_to_their_bound_and_moves_are_kept(store: QueueStore) -> None:
    clock = Clock()
    queue = Queue(store, clock=clock)
    await queue.declare_schedules([every(seconds=1)])
    clock.move(1 * S)
    await queue.run_schedules()  # a run that stays pending: every later tick is missed or skipped
    for _ in range(11):
        clock.move(100 * S)  # 100 ticks: 99 missed and one skipped, an event each
        await queue.run_schedules()
    await queue.pause_schedule("beat", note="a move among tick events")
    clock.move(50 * S)
    await queue.run_schedules()  # 1150 tick events written in all (2 s … 1151 s): the newest 1000 are kept
    skipped = await queue.schedule_events("beat", limit=1000, skipped_only=True)
    assert len(skipped) == KEPT_TICK_EVENTS and all(e.through_ms is None for e in skipped)
    assert (skipped[0].tick_ms, skipped[-1].tick_ms) == (T0 + 1151 * S, T0 + 152 * S)
    newest = await queue.schedule_events("beat", limit=1000)
    assert [e.kind for e in newest if not e.skipped_tick] == ["pause"]  # older than 50 tick events, still there


# -- bad input ------------------------------------------------------------------------------------------------------

BAD_SPECS: list[tuple[dict[str, Any], type[Exception]]] = [
    ({"cron": "61 * * * *"}, ValueError),
    ({"cron": "* * *"}, ValueError),
    ({"cron": 5}, TypeError),
    ({"cron": "* * * * *", "every": 10}, ValueError),
    ({}, ValueError),
    ({"every": 0.01}, ValueError),
    ({"every": True}, ValueError),
    ({"every": -5}, ValueError),
    ({"every": 10, "tz": "Mars/Olympus"}, ValueError),
    ({"every": 10, "tz": None}, TypeError),
    ({"every": 10, "overlap": "sometimes"}, ValueError),
    ({"every": 10, "missed": "never"}, ValueError),
    ({"every": 10, "queue": "bad queue"}, ValueError),
    ({"every": 10, "priority": 101}, ValueError),
    ({"every": 10, "max_attempts": 0}, ValueError),
]


@pytest.mark.parametrize(("fields", "error"), BAD_SPECS)
async def test_a_bad_schedule_is_refused_before_any_statement(
    store: QueueStore, fields: dict[str, Any], error: type[Exception]
) -> None:
    queue = Queue(store, clock=Clock())
    await queue.declare_schedules([every("kept")])
    before = await state(queue)
    with pytest.raises(error):
        await queue.declare_schedules([every("kept"), ScheduleSpec("beat", {}, **fields)], scope=["default"])
    assert await state(queue) == before
    await assert_no_transaction_left(store)


async def test_bad_names_notes_and_arguments_are_refused_before_any_statement(store: QueueStore) -> None:
    queue = Queue(store, clock=Clock())
    await queue.declare_schedules([every()])
    before = await state(queue)
    for call in (queue.pause_schedule, queue.resume_schedule, queue.run_schedule_now):
        with pytest.raises(ValueError):
            await call("bad name", note="x")
        with pytest.raises(ValueError):
            await call("beat", note="")
        with pytest.raises(ValueError):
            await call("beat", note="x", by=" ")
    with pytest.raises(ValueError, match="named twice"):
        await queue.declare_schedules([every(), every()])
    with pytest.raises(TypeError):
        await queue.declare_schedules([{"name": "beat"}])  # type: ignore[list-item]
    with pytest.raises(TypeError):
        await queue.declare_schedules([every()], scope="default")
    with pytest.raises(ValueError):
        await queue.declare_schedules([ScheduleSpec("x" * 65, {}, every=10)])
    with pytest.raises(ValueError):
        await queue.schedule_events(limit=0)
    assert await state(queue) == before
    await assert_no_transaction_left(store)
