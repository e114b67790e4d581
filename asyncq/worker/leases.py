"""A pool's leases: renewed in one commit, every quarter lease, for each job past half its lease; a job whose
renewal is refused (the lease was lost: it expired and another worker took the job) is dropped from the buffer,
or its handler is cancelled, and its result is never written. A stopping pool gives back the jobs it claimed
ahead and never started."""

from __future__ import annotations

import asyncio
import logging

import anyio

from asyncq.errors import StoreBusy
from asyncq.queue import Queue
from asyncq.worker.flight import Flights, InFlight
from asyncq.worker.report import PoolReport

log = logging.getLogger("asyncq.worker.pool")


class LeaseKeeper:
    """Renews the leases of a pool's jobs in flight; ``fences`` keeps a renewal and a group commit apart (each
    reads the tickets the other replaces)."""

    def __init__(self, queue: Queue, lease_ms: int, flights: Flights, fences: asyncio.Lock, report: PoolReport):
        self.queue = queue
        self.lease_ms = lease_ms
        self.flights = flights
        self.fences = fences
        self.report = report

    async def run(self) -> None:
        """Renew every quarter lease, until cancelled."""
        while True:
            await anyio.sleep(self.lease_ms / 4000)
            await self.renew_once()

    async def renew_once(self) -> int:
        """Extend (in one commit) each lease past half its length; drop the jobs whose lease was lost. How many
        leases were due (a busy store renews none of them: the next quarter lease tries again)."""
        async with self.fences:
            now = self.queue.now()
            half = self.lease_ms // 2
            due = [flight for flight in self.flights.jobs.values() if flight.ticket.lease_until - now <= half]
            if not due:
                return 0
            try:
                with anyio.CancelScope(shield=True):  # a renewal that lands is always recorded
                    renewed = await self.queue.extend_many([flight.ticket for flight in due], self.lease_ms)
            except StoreBusy as error:
                self.report.store_busy(error, f"{len(due)} lease(s) not renewed, trying again")
                return len(due)
            for flight, ticket in zip(due, renewed, strict=True):
                if ticket is not None:
                    flight.ticket = ticket
                else:
                    self.lose(flight)
            return len(due)

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
