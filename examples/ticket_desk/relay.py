"""The outbox relay: publishes committed registrations to RabbitMQ, in order, and marks each one sent only
after the broker confirmed that a queue holds it.

A registration and its outbox row commit together, so a registration is never saved without its message
(and never published without being saved). A crash between the confirm and ``mark_sent`` publishes the
row again on the next run: the worker's completion key makes that duplicate harmless. A ``mark_sent``
that fails because a worker holds the store's write transaction is retried without publishing again.
An unroutable publish (no queue bound) raises ``Unroutable`` and the row stays unsent.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import sqlite3
from pathlib import Path

from asyncq import RetryPolicy
from asyncq.delivery.base import Transport
from asyncq.errors import AsyncqError

import store

log = logging.getLogger("ticket_desk.relay")
BACKOFF = RetryPolicy(base=0.2, cap=10)  # between failed runs: 0.2 s doubling up to 10 s, jittered


class OutboxRelay:
    """Moves unsent outbox rows of the store at ``db_path`` through ``transport``.

    ``run_once()`` publishes what is waiting now; ``run_forever()`` repeats it, woken by :meth:`wake`
    after each registration and polling every ``poll_seconds`` as a fallback.
    """

    def __init__(self, db_path: Path, transport: Transport, *, batch: int = 100, poll_seconds: float = 5.0):
        self.db_path = db_path
        self.transport = transport
        self.batch = batch
        self.poll_seconds = poll_seconds
        self._wake = asyncio.Event()
        self._confirmed: list[int] = []  # confirmed by the broker, not yet marked sent (the store was busy)

    def wake(self) -> None:
        """Ask the relay to look at the outbox now."""
        self._wake.set()

    async def run_once(self) -> int:
        """Publish waiting rows in ``seq`` order; stop at the first failure, which propagates (that row
        and the ones after it stay unsent). Returns how many rows were confirmed."""
        await self._mark_confirmed()
        rows = await asyncio.to_thread(store.read, self.db_path, store.unsent, self.batch)
        for row in rows:
            await self.transport.deliver(row.message_id, json.loads(row.body), {"outbox-seq": str(row.seq)})
            self._confirmed.append(row.seq)
            await self._mark_confirmed()
        return len(rows)

    async def _mark_confirmed(self) -> None:
        while self._confirmed:
            await asyncio.to_thread(store.write, self.db_path, store.mark_sent, self._confirmed[0])
            self._confirmed.pop(0)

    async def run_forever(self) -> None:
        """``run_once()`` until cancelled: at once while rows keep coming, after a wake-up or the poll
        interval when the outbox is empty, after a growing delay when publishing fails."""
        failures = 0
        while True:
            self._wake.clear()
            try:
                sent = await self.run_once()
                failures = 0
            except (AsyncqError, sqlite3.Error) as exc:
                failures += 1
                delay = BACKOFF.delay_ms(failures, None) / 1000
                log.warning("outbox relay: %s; next try in %.1f s", exc, delay)
                await asyncio.sleep(delay)
                continue
            if sent < self.batch:
                await self._idle()

    async def _idle(self) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wake.wait(), timeout=self.poll_seconds)
