"""A pool's idle offer (``asyncq.core.offers``): what its next group commit says of it, and the jobs another process's
enqueue claimed for it, read when the pool wakes up."""

from __future__ import annotations

import logging

from asyncq.core.offers import Offer, next_offer, offer_length, offer_step
from asyncq.queue import Queue
from asyncq.worker.flight import Flights
from asyncq.worker.report import PoolReport

log = logging.getLogger("asyncq.worker.pool")


class Offering:
    """The offer of the pool ``owner`` on ``queue``: out until ``until`` (ms; ``None``: none out). Jobs may be claimed
    for it until its last end has passed (an enqueue that read it may commit after the pool withdrew it), so the
    pool reads and takes them until then."""

    __slots__ = ("_drain_until", "_flights", "_length", "_owner", "_picked", "_queue", "_report", "until")

    def __init__(self, queue: Queue, owner: str, poll_max_seconds: float, flights: Flights, report: PoolReport) -> None:
        self._queue, self._owner, self._flights, self._report = queue, owner, flights, report
        self._length = offer_length(int(poll_max_seconds * 1000))
        self.until: int | None = None
        self._drain_until = 0
        self._picked: set[int] = set()  # the seqs of the jobs offered to the pool that its reads found

    def terms(self, slots: int) -> Offer | None:
        """The ``Offer`` of the next commit, with ``slots`` free (0 while stopping, in a burst or with no slot free:
        an offer out is withdrawn); ``None`` when it has nothing to say."""
        now = self._queue.now()
        return next_offer(self.until, now < self._drain_until, now, slots, self._length, frozenset(self._picked))

    def settled(self, offer: Offer | None, tickets: int) -> None:
        """A commit with ``offer`` landed, returning ``tickets`` tickets: the offer is out, renewed or withdrawn as
        the store did it (``core.offers.offer_step``), and the jobs the reads found are no longer noted."""
        if offer is None:
            return
        step = offer_step(offer, tickets)
        if step.withdraw:
            self.until = None
        elif step.write:
            self.until = offer.until_ms
            self._drain_until = max(self._drain_until, offer.until_ms)
        self._picked.difference_update(offer.picked)

    async def pick_up(self) -> None:
        """Start the jobs claimed for the offer since the last read and commit (none without an offer, and no read),
        but those the pool holds already; its next commit counts their attempts. A read that fails is logged: that
        commit takes them instead."""
        if self.until is None and self._queue.now() >= self._drain_until:
            return
        held = self._flights.jobs
        try:
            found = await self._queue.offered(self._owner)
        except Exception as error:
            log.warning("reading the jobs offered to %s failed (its next commit takes them): %r", self._owner, error)
            return
        new = [
            ticket for ticket in found if ticket.seq not in self._picked and (ticket.id, ticket.fence.token) not in held
        ]
        if new:
            self._picked.update(ticket.seq for ticket in new)
            self._report.claimed(len(new))  # counted as the pool's own claims are
            self._flights.buffer_all(new)
