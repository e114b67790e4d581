"""A pool's schedule keeper, beside the batcher and outside the per-job path: at the pool's start it declares the
schedules an app attached to the pool (``App.attach``: upserted, the undeclared ones of its queues retired), then
evaluates the store's schedules (``Queue.run_schedules``) whenever a tick is due by the queue's injected clock, and
at least every ``check`` seconds while any schedule lives (a change made by another process is seen then; one made
in this process wakes it at once). Every pool may run one: the store's compare-and-set makes each tick one job."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence

import anyio

from asyncq.core.schedules import ScheduleRun, ScheduleSpec
from asyncq.errors import StoreBusy
from asyncq.queue import Queue
from asyncq.worker.report import PoolReport

log = logging.getLogger("asyncq.worker.pool")

#: How long a keeper waits between looks at a store with no live schedule (a declaration in this process wakes it).
IDLE_CHECK = 30.0
#: The shortest wait between two looks (a tick due already, by a clock that another process's write moved past).
MIN_WAIT = 0.005


class ScheduleKeeper:
    """Declares a pool's schedules at its start, then evaluates the store's (``evaluate``); counted in the pool's
    report."""

    def __init__(self, queue: Queue, report: PoolReport, check: float, *, evaluate: bool = True) -> None:
        self.queue = queue
        self.report = report
        self.check = check
        self.evaluate = evaluate
        self.declared: list[ScheduleSpec] | None = None  # None: nothing declared by this pool, nothing retired
        self.scope: list[str] = []
        self._landed = False  # the declarations are in the store

    def declare(self, schedules: Iterable[ScheduleSpec], scope: Sequence[str]) -> None:
        """Declare ``schedules`` (and retire the undeclared schedules of the queues ``scope``) when the pool starts."""
        by_name = {spec.name: spec for spec in [*(self.declared or []), *schedules]}  # an app attached twice
        self.declared = list(by_name.values())
        self.scope = sorted({*self.scope, *scope})
        self._landed = False

    async def run(self) -> None:
        """Declare (until it lands), then evaluate until cancelled."""
        while not await self.declare_once():
            await anyio.sleep(self.check)
        while self.evaluate:
            changed = self.queue.schedule_changed()  # taken before the read: a change made meanwhile wakes it
            with anyio.move_on_after(await self.run_once()):
                await changed.wait()

    async def declare_once(self) -> bool:
        """Write the declarations, if any and not written yet; whether they are in the store (``False``: try again,
        it was logged)."""
        if self.declared is None or self._landed:
            return True
        try:
            await self.queue.declare_schedules(self.declared, scope=self.scope)
        except StoreBusy as error:
            self.report.store_busy(error, "schedules not declared yet")
            return False
        except Exception as error:  # the pool works on; the next try may land
            self.report.counters.internal_errors += 1
            log.error("declaring the schedules failed: %r", error, exc_info=error)
            return False
        self._landed = True
        return True

    async def run_once(self) -> float:
        """Evaluate the schedules once; how many seconds to wait before the next look: until the soonest tick by the
        queue's clock, at most ``check`` (``IDLE_CHECK`` with no live schedule)."""
        try:
            done = await self.queue.run_schedules()
        except StoreBusy as error:
            self.report.store_busy(error, "schedules not evaluated")
            return self.check
        except Exception as error:  # the next look tries again
            self.report.counters.internal_errors += 1
            log.error("evaluating the schedules failed: %r", error, exc_info=error)
            return self.check
        self.report.schedules(done)
        return self._wait(done)

    def _wait(self, done: ScheduleRun) -> float:
        if done.failed:  # a schedule that fails is tried again at the next check, not at once
            return self.check
        if done.next_due is None:
            return self.check if done.waiting else IDLE_CHECK
        return min(self.check, max(MIN_WAIT, (done.next_due - self.queue.now()) / 1000))
