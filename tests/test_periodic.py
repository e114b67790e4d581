"""``@app.periodic`` and the pool's schedule keeper on a real store of every driver: the app's schedules are declared
when its pool starts (those of its queues no longer declared retired), the keeper fires each tick as the queue's
injected clock reaches it (the test moves the clock; the keeper is woken by in-process changes and looks again
within ``poll_max``), a pool with ``schedules=False`` declares but never evaluates, and a bad declaration fails at
import with nothing registered."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from drivers import DRIVERS, Driver
from waiting import eventually

from asyncq import App, Job, Queue
from asyncq.core.schedules import ScheduleSpec, schedule_job_id
from asyncq.errors import InvalidArguments
from asyncq.worker.report import PoolReport
from asyncq.worker.schedules import ScheduleKeeper

pytestmark = pytest.mark.timeout(30)

T0 = 1_700_000_000_000
S = 1000


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> int:
        return self.now


@pytest.fixture(params=sorted(DRIVERS))
def driver(request: pytest.FixtureRequest) -> Driver:
    return DRIVERS[request.param].prepare(request)


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
async def queue(driver: Driver, tmp_path: Path, clock: Clock) -> AsyncIterator[Queue]:
    async with driver.target(tmp_path, "queue") as where, await Queue.open(where, clock=clock) as opened:
        yield opened


async def _done(queue: Queue, job_id: str) -> Job | None:
    job = await queue.get(job_id)
    return job if job is not None and job.status == "done" else None


def make_app(ran: list[str]) -> App:
    app = App()

    @app.periodic(every=10, kwargs={"region": "eu"})
    async def rollup(region: str) -> None:
        ran.append(region)

    @app.periodic(cron="*/5 * * * *", tz="Europe/Berlin", name="nightly-ish", queue="mail")
    @app.task(queue="mail")
    async def digest() -> None:
        ran.append("digest")

    return app


async def test_a_pool_declares_the_apps_schedules_and_fires_each_tick_as_the_clock_reaches_it(
    queue: Queue, clock: Clock
) -> None:
    ran: list[str] = []
    app = make_app(ran)
    pool = app.pool(queue, poll_min=0.01, poll_max=0.05, concurrency=2)
    task = asyncio.create_task(pool.run())
    try:
        await eventually(lambda: queue.schedules(), "the schedules declared")
        assert sorted(s.name for s in await queue.schedules()) == ["nightly-ish", "rollup"]
        clock.now += 10 * S
        await eventually(lambda: ran == ["eu"], "the first tick's run")
        # overlap="skip": a tick while the last run is still active is skipped, so its finish must land first (a
        # group commit under load lands it after the handler returned)
        first = schedule_job_id("rollup", T0 + 10 * S)
        await eventually(lambda: _done(queue, first), "the first rollup's finish committed")
        clock.now += 10 * S
        await eventually(lambda: ran == ["eu", "eu"], "the second tick's run")
        second = schedule_job_id("rollup", T0 + 20 * S)  # its finish lands before the clock outruns its lease
        await eventually(lambda: _done(queue, second), "the second rollup's finish committed")
        clock.now += 80 * S  # 22:15:00Z: digest's first tick; rollup missed seven ticks, runs the latest
        await eventually(lambda: sorted(ran) == ["digest", "eu", "eu", "eu"], "the digest and the latest rollup")
        assert pool.counters.schedule_ticks == {"fired": 4, "skipped": 0, "missed": 7}
        job_id = schedule_job_id("rollup", T0 + 100 * S)
        job = await eventually(lambda: _done(queue, job_id), "the latest rollup's finish committed")
        assert (job.body, job.task) == ({"task": "rollup", "args": {"region": "eu"}}, "rollup")
    finally:
        pool.stop()
        await asyncio.wait_for(task, 10)


async def test_a_pool_of_an_app_without_a_schedule_retires_it_only_for_its_queues(queue: Queue) -> None:
    first = make_app([])
    await first.pool(queue, poll_min=0.01, poll_max=0.05).run(burst=True)
    later = App()  # the next deploy: rollup (queue default) is gone; digest's queue is not this worker's

    @later.task
    async def other() -> None: ...

    await later.pool(queue, queues=["default"], poll_min=0.01, poll_max=0.05, schedules=False).run(burst=True)
    state = {s.name: s.retired for s in await queue.schedules()}
    assert state == {"nightly-ish": False, "rollup": True}
    assert [e.kind for e in await queue.schedule_events("rollup")] == ["retired", "declared"]


async def test_a_pool_with_schedules_off_declares_but_never_fires(queue: Queue, clock: Clock) -> None:
    ran: list[str] = []
    pool = make_app(ran).pool(queue, poll_min=0.01, poll_max=0.05, schedules=False)
    task = asyncio.create_task(pool.run())
    try:
        await eventually(lambda: queue.schedules(), "the schedules declared")
        clock.now += 30 * S
        done = await queue.run_schedules()  # another process's evaluation: the pool runs what it enqueues
        await eventually(lambda: ran == ["eu"], "the job another evaluation enqueued")
        assert pool.counters.schedule_ticks == {} and len(done.jobs) == 1
    finally:
        pool.stop()
        await asyncio.wait_for(task, 10)


def test_a_bad_declaration_fails_at_import_with_nothing_registered() -> None:
    app = App()
    with pytest.raises(ValueError, match="minute"):

        @app.periodic(cron="61 * * * *")
        async def early() -> None: ...

    with pytest.raises(ValueError, match="time zone"):
        app.periodic(every=10, tz="Nowhere/Atlantis")
    with pytest.raises(InvalidArguments):

        @app.periodic(every=10, kwargs={"n": "not a number"})
        async def counted(n: int) -> None: ...

    assert "early" not in app.tasks and app.schedules == {}
    assert "counted" in app.tasks  # the task itself was fine; its schedule's arguments were not

    @app.periodic(every=10)
    async def beat() -> None: ...

    with pytest.raises(ValueError, match="declared already"):
        app.periodic(every=20, name="beat")(beat)
    with pytest.raises(ValueError, match="name"):
        app.periodic(every=20, name="not a name")
    assert list(app.schedules) == ["beat"] and app.schedules["beat"].task == "beat"


async def test_the_keeper_sleeps_until_the_next_tick_and_wakes_on_a_change_made_in_its_process(
    queue: Queue, clock: Clock
) -> None:
    ran: list[str] = []
    app = App()

    @app.periodic(every=60)
    async def beat() -> None:
        ran.append("beat")

    pool = app.pool(queue, poll_min=0.01, poll_max=3600)  # the keeper's longest sleep: an hour
    task = asyncio.create_task(pool.run())
    try:
        await eventually(lambda: queue.schedules(), "the schedule declared")
        clock.now += 60 * S  # due now by the queue's clock; the keeper sleeps on (a minute, as it computed)
        await queue.declare_schedules([ScheduleSpec("other", {}, every=3600, queue="elsewhere")])  # wakes it
        await eventually(lambda: ran == ["beat"], "the tick run once the keeper woke", timeout=5)
    finally:
        pool.stop()
        await asyncio.wait_for(task, 10)


async def test_a_schedule_whose_tick_fails_is_logged_counted_and_retried_at_the_next_check(
    queue: Queue, clock: Clock
) -> None:
    await queue.declare_schedules([ScheduleSpec("beat", {"n": 1}, every=10), ScheduleSpec("other", {}, every=10)])
    await queue.enqueue(schedule_job_id("beat", T0 + 10 * S), {"not": "the schedule's body"})  # its id, taken
    clock.now += 10 * S
    report = PoolReport(None)
    keeper = ScheduleKeeper(queue, report, 0.5)
    assert await keeper.run_once() == 0.5  # not at once again: the failure would repeat
    assert report.counters.internal_errors == 1 and report.counters.schedule_ticks["fired"] == 1  # "other" ran
    [beat] = [s for s in await queue.schedules() if s.name == "beat"]
    assert (beat.last_tick, beat.ticks_fired) == (None, 0)  # rolled back whole: due again at the next look
