"""A pool serving limited queues, in one process (docs/flow-control.md, "Limits"): held by a rate, it sleeps until
the next start is due on the queue's injected clock instead of claiming again and again (neither a poll nor an
enqueue's wake-up makes it claim for nothing); a burst run waits for the jobs a limit holds; and the wait it takes is
``core.flow_limits.held_wait``'s (checked here as values)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import T0
from waiting import eventually

from asyncq.core.flow_limits import Hold, held_wait
from asyncq.queue import Queue
from asyncq.worker.pool import JobContext, Pool

pytestmark = pytest.mark.timeout(30)


def test_held_wait_without_holds_is_the_poll_and_the_store_may_wake_it() -> None:
    assert held_wait((), ["a"], T0, 0.05, 1.0) == (0.05, True)


def test_held_wait_for_a_rate_holding_every_queue_is_until_the_next_start_unwoken() -> None:
    holds = (Hold("a", T0 + 400, True), Hold("b", T0 + 900, True))
    assert held_wait(holds, ["a", "b"], T0, 0.05, 1.0) == (0.4, False)
    assert held_wait(holds, ["a", "b"], T0, 0.05, 0.25) == (0.25, False)  # a limit changed is seen by poll_max
    assert held_wait((Hold("a", T0 - 5, True),), ["a"], T0, 0.05, 1.0) == (0.0, False)  # due already: claim now


def test_held_wait_with_a_queue_free_or_held_by_slots_is_woken_by_the_store() -> None:
    assert held_wait((Hold("a", T0 + 400, True),), ["a", "b"], T0, 0.05, 1.0) == (0.05, True)  # b may get jobs
    assert held_wait((Hold("a", T0 + 20, False),), ["a"], T0, 0.05, 1.0) == (0.02, True)  # a finish may free one


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> int:
        return self.now


async def test_a_pool_held_by_a_rate_sleeps_until_the_next_start_on_the_injected_clock(tmp_path: Path) -> None:
    clock = Clock()
    async with await Queue.open(tmp_path / "q.db", clock=clock) as queue:
        await queue.set_limits("paced", rate=1, per=60.0)
        await queue.enqueue("a", {}, queue="paced")
        await queue.enqueue("b", {}, queue="paced")
        ran: list[str] = []

        async def handle(body: Any, context: JobContext) -> None:
            ran.append(context.id)

        pool = Pool(queue, concurrency=4, poll_min=0.001, poll_max=0.25)
        pool.register("paced", handle)
        running = asyncio.create_task(pool.run())
        try:
            await eventually(lambda: ran == ["a"], "the first job, the rate's room")
            [usage] = await queue.limits()
            assert usage.rate_next_ms == T0 + 60_000  # held: the next start is a minute away on the queue's clock
            held_from, commits = time.monotonic(), pool.counters.commits
            for n in range(20):  # each enqueue would wake an idle pool: one held by its rate is not woken
                await queue.enqueue(f"more{n}", {}, queue="paced")
            await eventually(lambda: time.monotonic() - held_from > 0.3, "a poll's length to pass")
            attempts = pool.counters.commits - commits
            assert attempts <= (time.monotonic() - held_from) / 0.25 + 2, attempts  # a claim per poll_max at most
            assert ran == ["a"]
            clock.now = T0 + 60_000  # the next start is due: the pool claims it within its sleep
            await eventually(lambda: ran == ["a", "b"], "the second job once the rate lets it start", timeout=5)
            assert ran == ["a", "b"]
        finally:
            pool.stop()
            await running


async def test_a_burst_run_waits_for_the_jobs_a_rate_holds(tmp_path: Path) -> None:
    async with await Queue.open(tmp_path / "q.db") as queue:  # the wall clock: 3 jobs at 20 a second
        await queue.set_limits("paced", rate=20, per=1.0)
        for n in range(3):
            await queue.enqueue(f"j{n}", {}, queue="paced")
        ran: list[str] = []

        async def handle(body: Any, context: JobContext) -> None:
            ran.append(context.id)

        pool = Pool(queue, concurrency=4, poll_min=0.001, poll_max=0.25)
        pool.register("paced", handle)
        await pool.run(burst=True)
        assert ran == ["j0", "j1", "j2"]
        assert [job.status for job in await queue.list_jobs()] == ["done"] * 3
