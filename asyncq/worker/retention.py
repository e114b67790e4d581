"""A pool's retention step (``Queue.apply_retention``), run beside the batcher, outside the per-job path: at most
once per ``every`` of the queue's injected clock, each run a few bounded transactions. Another process's pool may
run it too: a row removed by one is simply not found by the other."""

from __future__ import annotations

import logging

import anyio

from asyncq.core.retention import RetentionReport
from asyncq.errors import StoreBusy
from asyncq.queue import Queue
from asyncq.worker.report import PoolReport

log = logging.getLogger("asyncq.worker.pool")


def retention_keepers(queue: Queue, every_ms: int | None, check: float, report: PoolReport) -> list[RetentionKeeper]:
    """A pool's retention keeper, running every ``every_ms`` of the queue's clock (none for ``None``: turned off)."""
    return [] if every_ms is None else [RetentionKeeper(queue, every_ms, check, report)]


class RetentionKeeper:
    """Runs ``queue.apply_retention()`` when ``every_ms`` of the queue's clock have passed since its last run
    (the first at once), looking every ``check`` seconds; counted in the pool's report."""

    def __init__(self, queue: Queue, every_ms: int, check: float, report: PoolReport) -> None:
        self.queue = queue
        self.every_ms = every_ms
        self.check = check
        self.report = report
        self.last_ms: int | None = None

    async def run(self) -> None:
        """Until cancelled."""
        while True:
            await self.run_once()
            await anyio.sleep(self.check)

    async def run_once(self) -> RetentionReport | None:
        """Apply retention if it is due; what it removed (``None``: not due, or the store was busy: the next
        check tries again)."""
        now = self.queue.now()
        if self.last_ms is not None and now - self.last_ms < self.every_ms:
            return None
        try:
            done = await self.queue.apply_retention()
        except StoreBusy as error:
            self.report.store_busy(error, "retention not applied")
            return None
        except Exception as error:  # the pool goes on working; the next run tries again
            self.report.counters.internal_errors += 1
            log.error("retention failed: %r", error, exc_info=error)
            return None
        self.last_ms = now
        self.report.retention(done)
        return done
