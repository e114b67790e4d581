"""A pool cancels a running job on request (``Queue.cancel``), on a real store in this process, on every driver:
a cancel made in this process wakes the renewer at once; ``asyncq.shield`` defers the cancellation to the end of
the section; ``cancel_grace`` lets a handler finish first (its own outcome then stands); a job claimed ahead and
never started is given back and ended by the next claim's sweep. Waits are on events the handlers set, or on the
store's state under a deadline (``eventually``)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from drivers import DRIVERS, Driver
from waiting import eventually

import asyncq
from asyncq.queue import Queue
from asyncq.worker.pool import JobContext, Pool

pytestmark = pytest.mark.timeout(30)

LEASE = 30.0  # long: nothing here may wait for a quarter lease; the in-process wake-up renews at once


@pytest.fixture(params=sorted(DRIVERS))
def driver(request: pytest.FixtureRequest) -> Driver:
    return DRIVERS[request.param].prepare(request)


@pytest.fixture
async def queue(driver: Driver, tmp_path: Path) -> AsyncIterator[Queue]:
    async with driver.target(tmp_path, "queue") as where, await Queue.open(where) as opened:
        yield opened


async def status(queue: Queue, job_id: str) -> tuple[str, str | None]:
    job = await queue.get(job_id)
    assert job is not None
    return job.status, job.reason


async def ended(queue: Queue, job_id: str, wanted: tuple[str, str | None]) -> None:
    async def check() -> bool:
        return await status(queue, job_id) == wanted

    await eventually(check, f"{job_id} is {wanted}", timeout=10)


class Running:
    """A pool served in a task, stopped (and awaited) by ``close``."""

    def __init__(self, pool: Pool) -> None:
        self.pool = pool
        self.task = asyncio.create_task(pool.run())

    async def close(self) -> None:
        self.pool.stop()
        await asyncio.wait_for(self.task, 10)


async def test_a_cancel_in_this_process_stops_the_handler_at_once(queue: Queue) -> None:
    started, reached_the_end = asyncio.Event(), False

    async def forever(body: asyncq.JSON, job: JobContext) -> None:
        nonlocal reached_the_end
        started.set()
        await asyncio.Event().wait()
        reached_the_end = True

    pool = Pool(queue, concurrency=2, lease=LEASE)
    pool.register("default", forever)
    running = Running(pool)
    await queue.enqueue("a", {})
    await asyncio.wait_for(started.wait(), 10)
    asked = time.monotonic()
    assert (await queue.cancel("a", note="customer left")).state == "requested"
    await ended(queue, "a", ("dead", "cancelled"))
    assert time.monotonic() - asked < LEASE / 4  # woken, not waiting for the next quarter lease
    await running.close()
    assert not reached_the_end
    counters = pool.counters
    assert (counters.cancels_requested, counters.cancelled, counters.finished) == (1, 1, {"dead": 1})


async def test_a_shielded_section_finishes_before_the_cancellation_lands(queue: Queue) -> None:
    inside, release = asyncio.Event(), asyncio.Event()
    steps: list[str] = []

    async def critical(body: asyncq.JSON, job: JobContext) -> None:
        with asyncq.shield():
            inside.set()
            await release.wait()  # a cancel request arrives here: deferred
            steps.append("section done")
        steps.append("after the section")  # the deferred cancellation lands at the next await
        await asyncio.sleep(0)
        steps.append("never")

    pool = Pool(queue, concurrency=1, lease=LEASE)
    pool.register("default", critical)
    running = Running(pool)
    await queue.enqueue("a", {})
    await asyncio.wait_for(inside.wait(), 10)
    assert (await queue.cancel("a", note="stop")).state == "requested"
    await eventually(lambda: pool.counters.cancels_requested == 1, "the pool sees the request")
    assert await status(queue, "a") == ("leased", None)  # still inside the shield
    release.set()
    await ended(queue, "a", ("dead", "cancelled"))
    await running.close()
    assert steps == ["section done", "after the section"]


async def test_an_awaited_shield_returns_its_value(queue: Queue) -> None:
    async def compute() -> int:
        await asyncio.sleep(0)
        return 42

    assert await asyncq.shield(compute()) == 42  # outside a pool it only runs the awaitable


async def test_a_handler_that_ends_within_the_grace_keeps_its_outcome(queue: Queue) -> None:
    started, release = asyncio.Event(), asyncio.Event()

    async def quick(body: asyncq.JSON, job: JobContext) -> str:
        started.set()
        await release.wait()
        return "finished"

    pool = Pool(queue, concurrency=1, lease=LEASE, cancel_grace=30.0)
    pool.register("default", quick)
    running = Running(pool)
    await queue.enqueue("a", {})
    await asyncio.wait_for(started.wait(), 10)
    assert (await queue.cancel("a", note="stop")).state == "requested"
    await eventually(lambda: pool.counters.cancels_requested == 1, "the pool sees the request")
    release.set()  # the handler ends within its grace: its finish lands first
    await ended(queue, "a", ("done", None))
    await running.close()
    job = await queue.get("a")
    assert job is not None and job.result == "finished" and pool.counters.cancelled == 0
    assert (await queue.cancel("a", note="late")).state == "too_late"


async def test_a_handler_that_fails_after_a_request_is_not_retried(queue: Queue) -> None:
    started, release = asyncio.Event(), asyncio.Event()
    runs: list[int] = []

    async def flaky(body: asyncq.JSON, job: JobContext) -> None:
        runs.append(job.attempt)
        started.set()
        await release.wait()
        raise asyncq.Retryable("busy", delay_ms=0)

    pool = Pool(queue, concurrency=1, lease=LEASE, cancel_grace=30.0)
    pool.register("default", flaky)
    running = Running(pool)
    await queue.enqueue("a", {}, max_attempts=5)
    await asyncio.wait_for(started.wait(), 10)
    assert (await queue.cancel("a", note="stop")).state == "requested"
    await eventually(lambda: pool.counters.cancels_requested == 1, "the pool sees the request")
    release.set()  # it fails first: retried, but with the request on its row the next claim's sweep ends it
    await ended(queue, "a", ("dead", "cancelled"))
    await running.close()
    assert runs == [1]


async def test_a_job_claimed_ahead_is_given_back_and_ended_by_the_sweep(queue: Queue) -> None:
    started, release = asyncio.Event(), asyncio.Event()
    ran: list[str] = []

    async def one_at_a_time(body: Any, job: JobContext) -> None:
        ran.append(job.id)
        started.set()
        await release.wait()

    pool = Pool(queue, concurrency=1, lease=LEASE, prefetch=1)
    pool.register("default", one_at_a_time)
    await queue.enqueue("a", {})
    await queue.enqueue("b", {})
    running = Running(pool)
    await asyncio.wait_for(started.wait(), 10)
    await eventually(lambda: len(pool._flights.buffer) == 1, "b waits in the buffer")
    assert (await queue.cancel("b", note="not needed")).state == "requested"
    await eventually(lambda: pool.counters.cancels_requested == 1, "the pool sees the request")
    release.set()
    await ended(queue, "a", ("done", None))
    await ended(queue, "b", ("dead", "cancelled"))
    await running.close()
    assert ran == ["a"]
