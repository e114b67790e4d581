"""A working pool removes the finished jobs past their queue's retention (``PoolSettings.retention_every``), on a
real store of every driver: at most once per ``retention_every`` of the queue's injected clock, which the test
moves (no sleeps); counted in the pool's counters and its metrics."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from drivers import DRIVERS, Driver
from waiting import eventually

from asyncq.core.jsontext import JSON
from asyncq.queue import Queue
from asyncq.web.metrics import PoolMetrics
from asyncq.worker.pool import JobContext, Pool

pytestmark = pytest.mark.timeout(30)

T0 = 1_700_000_000_000


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


async def nothing(body: JSON, context: JobContext) -> None:
    return None


async def test_a_working_pool_removes_expired_jobs_at_most_once_per_interval(queue: Queue, clock: Clock) -> None:
    for n in range(3):
        await queue.enqueue(f"old-{n}", {"n": n})
    first = Pool(queue, concurrency=2, poll_max=0.05, retention_every=None)
    first.register("default", nothing)
    await first.run(burst=True)  # done at T0; this pool never runs retention
    assert first.counters.retention_runs == 0
    await queue.set_retention("default", done=60)
    clock.now = T0 + 61_000
    metrics = PoolMetrics()
    pool = Pool(queue, concurrency=2, poll_max=0.05, retention_every=60, observer=metrics)
    pool.register("default", nothing)
    task = asyncio.create_task(pool.run())
    try:
        await queue.enqueue("fresh", {"n": 3})
        await eventually(lambda: pool.counters.retention_removed.get("done") == 3, "the old jobs removed")
        await eventually(lambda: pool.counters.finished.get("done") == 1, "the fresh job done")
        assert [await queue.get(f"old-{n}") for n in range(3)] == [None] * 3
        assert pool.counters.retention_runs == 1  # the clock has not moved a minute since: no other run
        assert metrics.registry.get_sample_value("asyncq_retention_removed_total", {"state": "done"}) == 3
        clock.now += 60_001  # "fresh" ended at T0 + 61 s: now past its minute
        await eventually(lambda: pool.counters.retention_runs == 2, "the next run, a minute of the clock later")
        assert await queue.get("fresh") is None and pool.counters.retention_removed == {
            "done": 4, "cancelled": 0, "dead": 0
        }  # fmt: skip
    finally:
        pool.stop()
        await asyncio.wait_for(task, 10)
