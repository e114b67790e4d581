"""A pool's life in a process: waiting out a store whose lock another process holds (at start as while running),
waiting for work while idle, and serving until a signal."""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Awaitable, Callable, Collection, Sequence
from typing import TYPE_CHECKING

import anyio

from asyncq.core.flow_limits import Hold, held_wait
from asyncq.errors import StoreBusy
from asyncq.queue import Queue
from asyncq.worker.report import PoolReport

if TYPE_CHECKING:
    from asyncq.worker.pool import Pool

log = logging.getLogger("asyncq.worker.pool")


class BusyStore:
    """The wait before trying a busy store again (a debugger, a VM pause, a stopped process held its lock past the
    busy timeout): from ``low`` doubling up to ``high`` seconds while it stays busy, each wait logged and counted
    (``store_busy``, ``on_store_busy``); ``reset`` once a call went through."""

    def __init__(self, report: PoolReport, low: float, high: float) -> None:
        self.report = report
        self.low, self.high = low, high
        self.pause = 0.0

    async def wait(self, error: StoreBusy, what: str) -> None:
        """Count and log ``error`` (``what`` says what was kept or not done), then sleep the next pause."""
        self.pause = min(max(self.pause * 2, self.low), self.high)
        self.report.store_busy(error, f"{what}, trying again in {self.pause:.3f} s")
        await anyio.sleep(self.pause)

    def reset(self) -> None:
        self.pause = 0.0

    async def open(self, opener: Callable[[], Awaitable[Queue]]) -> Queue:
        """``await opener()``, waited out while the store is busy: a worker starting while another process holds
        the lock waits for it as a running pool does, instead of failing after the busy timeout."""
        while True:
            try:
                queue = await opener()
            except StoreBusy as error:
                await self.wait(error, "the queue is not open yet")
                continue
            self.reset()
            return queue


async def wait_for_work(
    queue: Queue,
    wake: asyncio.Event,
    seconds: float,
    report: PoolReport,
    holds: Sequence[Hold] = (),
    served: Collection[str] = (),
    poll_max: float = 0.0,
) -> None:
    """Nothing was ready: wait for an enqueue in this process (or a wake-up from another), ``wake`` (a job
    finished, a slot freed, a stop), or ``seconds`` (the poll). Queues their limits held (``holds``) shorten the
    wait to when they may let a job go, and when a rate holds every queue the pool ``served``, only time frees them:
    no store wake-up ends the wait (``core.flow_limits.held_wait``). Wake-ups the store lost since the last wait are
    reported first."""
    losses = queue.store.wakeup_losses - report.wakeup_losses_seen
    if losses > 0:
        report.wakeup_losses_seen += losses
        report.wakeups_lost(losses)
    seconds, woken = held_wait(holds, served, queue.now(), seconds, max(poll_max, seconds))
    wake.clear()
    with anyio.move_on_after(seconds):
        async with anyio.create_task_group() as waiters:

            async def on_enqueue() -> None:
                if not woken:
                    return
                await queue.wait_for_rows(seconds)
                waiters.cancel_scope.cancel()

            async def on_wake() -> None:
                await wake.wait()
                waiters.cancel_scope.cancel()

            waiters.start_soon(on_enqueue)
            waiters.start_soon(on_wake)


async def serve(pool: Pool, grace: float, burst: bool) -> None:
    """``pool.run`` until SIGINT or SIGTERM, then ``pool.stop()`` and give jobs in flight ``grace`` seconds; any
    still running then are cancelled unfinished (their leases expire and they run again)."""
    async with anyio.create_task_group() as group:

        async def watch_signals() -> None:
            with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
                async for signum in signals:
                    log.info("signal %d: stopping, %d job(s) in flight", signum, pool.running)
                    pool.stop()
                    await anyio.sleep(grace)
                    group.cancel_scope.cancel()
                    return

        async def work() -> None:
            await pool.run(burst=burst)
            group.cancel_scope.cancel()

        group.start_soon(watch_signals)
        group.start_soon(work)
