"""A pool's leases: renewed in one commit, every quarter lease, for each job past half its lease; a job whose
renewal is refused (the lease was lost: it expired and another worker took the job) is dropped from the buffer,
or its handler is cancelled, and its result is never written. A stopping pool gives back the jobs it claimed
ahead and never started.

A renewal also says which jobs have a cancel request (``Queue.cancel``): a running one's handler is cancelled after
the pool's ``cancel_grace`` (``asyncq.worker.cancelling``) and its worker finishes it dead (``cancelled``) under its
token; a buffered one is given back, and the next claim's sweep ends it. A cancel made in this process wakes the
keeper, which then renews every lease at once instead of waiting for the next quarter lease."""

from __future__ import annotations

import asyncio
import logging

import anyio

from asyncq.errors import StoreBusy
from asyncq.queue import Queue
from asyncq.worker.cancelling import cancel_unless_shielded
from asyncq.worker.flight import Flights, InFlight
from asyncq.worker.report import PoolReport

log = logging.getLogger("asyncq.worker.pool")


class LeaseKeeper:
    """Renews the leases of a pool's jobs in flight; ``fences`` keeps a renewal and a group commit apart (each
    reads the tickets the other replaces)."""

    def __init__(
        self,
        queue: Queue,
        lease_ms: int,
        flights: Flights,
        fences: asyncio.Lock,
        report: PoolReport,
        cancel_grace: float = 0.0,
    ) -> None:
        self.queue = queue
        self.lease_ms = lease_ms
        self.flights = flights
        self.fences = fences
        self.report = report
        self.cancel_grace = cancel_grace

    async def run(self) -> None:
        """Renew every quarter lease (every lease at once after a cancel in this process), until cancelled."""
        while True:
            requested = await self.queue.wait_for_cancel_request(self.lease_ms / 4000)
            await self.renew_once(every=requested)

    async def renew_once(self, *, every: bool = False) -> int:
        """Extend (in one commit) each lease past half its length (``every`` lease held); drop the jobs whose lease
        was lost, and cancel those whose cancel was requested. How many leases were due (a busy store renews none
        of them: the next quarter lease tries again)."""
        async with self.fences:
            now = self.queue.now()
            half = self.lease_ms // 2
            due = [flight for flight in self.flights.jobs.values() if every or flight.ticket.lease_until - now <= half]
            if not due:
                return 0
            try:
                with anyio.CancelScope(shield=True):  # a renewal that lands is always recorded
                    renewed = await self.queue.renew_many([flight.ticket for flight in due], self.lease_ms)
            except StoreBusy as error:
                self.report.store_busy(error, f"{len(due)} lease(s) not renewed, trying again")
                return len(due)
            give_back: list[InFlight] = []
            for flight, renewal in zip(due, renewed, strict=True):
                if renewal is None:
                    self.lose(flight)
                    continue
                flight.ticket = renewal.ticket
                if renewal.cancel_requested and not flight.cancel_requested:
                    self._cancel_requested(flight, give_back)
            if give_back:
                with anyio.CancelScope(shield=True):
                    await self.queue.release_many([flight.ticket for flight in give_back])
            return len(due)

    def _cancel_requested(self, flight: InFlight, give_back: list[InFlight]) -> None:
        """A renewal found a cancel request on ``flight``'s job: give it back if it waits in the buffer (the next
        claim's sweep ends it), or cancel its handler after the grace."""
        flight.cancel_requested = True
        self.report.counters.cancels_requested += 1
        log.info("job %s: cancel requested, stopping its handler", flight.ticket.id)
        if flight.task is None:
            self.flights.drop(flight)
            give_back.append(flight)
            return
        task = flight.task

        def deliver() -> None:
            if self.flights.cancel(flight):
                self.report.counters.cancelled += 1

        if self.cancel_grace > 0:
            asyncio.get_running_loop().call_later(self.cancel_grace, cancel_unless_shielded, task, deliver)
        else:
            cancel_unless_shielded(task, deliver)

    def lose(self, flight: InFlight) -> None:
        """The lease was taken away: drop the job from the buffer (counted now) or cancel its handler (counted by
        its worker, which keeps no result)."""
        if self.flights.drop(flight):
            self.report.lost(flight.ticket)

    async def release_buffer(self) -> None:
        """Stopping: give back the jobs claimed ahead and never started, so other workers take them at once
        instead of after their leases expire."""
        async with self.fences:
            flights = self.flights.take_buffer()
            with anyio.CancelScope(shield=True):
                released = await self.queue.release_many([flight.ticket for flight in flights])
        log.debug("released %d job(s) claimed ahead and never started", sum(released))
