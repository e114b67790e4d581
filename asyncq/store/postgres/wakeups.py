"""Waking waiting workers (and outbox relays) on PostgreSQL: in-process after this process's own commits, across
hosts by ``LISTEN/NOTIFY``, and by polling (the waiter's timeout) whatever happens.

Every transaction that makes work ready sends one ``NOTIFY`` (``statements.NOTIFY``; PostgreSQL folds a
transaction's identical notifications into one, and delivers it at commit). One dedicated connection per store
listens. If it is lost, waiting degrades to polling, the loss is logged and counted, the waiters are woken, and
the next wait tries to listen again (at most once a second, a long poll cut short for it). ``wakeups=poll`` (for a
PgBouncer in transaction mode, which drops a session's ``LISTEN``) never listens: other hosts' rows are found by
polling only. The outbox's relays wait on one of these too, on the outbox's own channel.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

import asyncpg

from asyncq.errors import StoreError
from asyncq.store.postgres.connection import Target, connect
from asyncq.store.postgres.failures import DRIVER_ERRORS
from asyncq.store.postgres.statements import channel as queue_channel

log = logging.getLogger("asyncq.store.postgres")

RETRY_SECONDS = 1.0


class Wakeups:
    """The waiters of one store, and its listening connection (``mode`` ``listen``) or none (``poll``)."""

    def __init__(self, target: Target, mode: str, *, channel: str | None = None, what: str = "jobs") -> None:
        self._target = target
        self.mode = mode
        #: The channel listened to (the queue's by default); ``what`` names its rows in log lines.
        self.channel = queue_channel(target.schema) if channel is None else channel
        self._what = what
        self._waiters: set[asyncio.Event] = set()
        self._listener: asyncpg.Connection[Any] | None = None
        self._next_try = 0.0
        self._closed = False
        self._missed = False  # a notification came while no task waited
        #: Notifications received from the server (this host's and others').
        self.received = 0
        #: Times the listening connection was lost or could not be opened (each logged).
        self.lost = 0

    async def start(self) -> None:
        """Listen now (``listen`` mode): a failure here is the store's opening failure."""
        if self.mode == "listen":
            self._listener = await self._listen()

    def notify(self) -> None:
        """Wake the tasks of this process waiting for new rows; with none waiting, the next wait returns at once
        (a notification that lands while a pool is busy in a cycle would otherwise wait out its poll)."""
        if not self._waiters:
            self._missed = True
        for event in self._waiters:
            event.set()

    async def wait(self, timeout: float) -> None:
        """Return when rows may be ready (a local commit, a notification), or after ``timeout`` seconds."""
        if self.mode == "listen" and self._listener is None and not self._closed:
            await self._relisten()
            if self._listener is None:  # not listening: wait no longer than the next try (a poll may be long)
                timeout = min(timeout, max(self._next_try - time.monotonic(), 0.0))
        if self._missed:
            self._missed = False
            return
        waiter = asyncio.Event()
        self._waiters.add(waiter)
        try:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout):
                    await waiter.wait()
        finally:
            self._waiters.discard(waiter)

    async def close(self) -> None:
        """Stop listening."""
        self._closed = True
        listener, self._listener = self._listener, None
        if listener is not None:
            with contextlib.suppress(*DRIVER_ERRORS):
                await listener.close(timeout=5)

    @property
    def listening(self) -> bool:
        """Whether notifications from other hosts reach this store now."""
        return self._listener is not None and not self._listener.is_closed()

    async def _listen(self) -> asyncpg.Connection[Any]:
        conn = await connect(self._target)
        try:
            await conn.add_listener(self.channel, self._on_notification)
            conn.add_termination_listener(self._on_lost)
        except BaseException:
            await conn.close()
            raise
        return conn

    async def _relisten(self) -> None:
        if time.monotonic() < self._next_try:
            return
        self._next_try = time.monotonic() + RETRY_SECONDS
        try:
            self._listener = await self._listen()
        except (StoreError, *DRIVER_ERRORS) as error:
            self.lost += 1
            log.warning(
                "%s: cannot listen for new %s (polling until it can): %s", self._target.location, self._what, error
            )
            return
        log.info("%s: listening for new %s%s", self._target.location, self._what, " again" if self.lost else "")
        self.notify()  # rows may have come while nobody listened

    def _on_notification(self, _conn: object, _pid: int, _channel: str, _payload: object) -> None:
        self.received += 1
        self.notify()

    def _on_lost(self, _conn: object) -> None:
        if self._closed:
            return
        self._listener = None
        self.lost += 1
        self.notify()  # the waiters wait again, listening again first (rows may come while nobody listens)
        log.warning(
            "%s: lost the connection listening for new %s (polling until it is back)", self._target.location, self._what
        )
