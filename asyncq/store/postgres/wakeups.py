"""Waking waiting workers (and outbox relays) on PostgreSQL: in-process after this process's own commits, across
hosts by ``LISTEN/NOTIFY``, and by polling (the waiter's timeout) whatever happens.

Every transaction that makes work ready sends one ``NOTIFY`` (``statements.NOTIFY``; PostgreSQL folds a
transaction's identical notifications into one, and delivers it at commit). One dedicated connection per store
listens. If it is lost, waiting degrades to polling, the loss is logged and counted, the waiters are woken, and
the next wait tries to listen again (at most once a second, a long poll cut short for it). ``wakeups=poll`` (the
default behind a pooler in transaction mode, which drops a session's ``LISTEN``) never listens: other hosts' rows
are found by polling only. The outbox's relays wait on one of these too, on the outbox's own channel.

Behind a pooler said to pool sessions (``?pooler=session``) the first listen checks that a notification sent on
another connection reaches the listener (``PROBE``): a pooler in transaction mode would lose every one of them
silently. The queue's open then fails saying so; a relay's wait logs it once and polls from then on.
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
#: The payload of the check that notifications reach the listener through a pooler; listeners ignore it.
PROBE = "asyncq-probe"
#: How long that check waits for its notification.
PROBE_SECONDS = 3.0


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
        self._relistening: asyncio.Task[None] | None = None  # an attempt to listen again, in its own task
        self._probe: asyncio.Event | None = None  # set when this store's own probe comes back
        self._probed = target.pooler != "session"  # only a pooler said to pool sessions is checked
        #: Notifications received from the server (this host's and others').
        self.received = 0
        #: Times the listening connection was lost or could not be opened (each logged).
        self.lost = 0

    async def start(self) -> None:
        """Listen now (``listen`` mode): a failure here is the store's opening failure, and so is a pooler that loses
        notifications (a ``StoreError`` saying so)."""
        if self.mode == "listen":
            self._listener = await self._listen()
            if not self._probed and not await self._delivered():
                raise StoreError(self._lost_message())

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
            began = time.monotonic()
            await self._relisten_within(timeout)
            timeout = max(timeout - (time.monotonic() - began), 0.0)
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
        if self._relistening is not None:
            self._relistening.cancel()
            await asyncio.gather(self._relistening, return_exceptions=True)
        await self._drop_listener()

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

    async def _delivered(self) -> bool:
        """Whether a notification sent on a connection of its own reaches the listener within ``PROBE_SECONDS``
        (through a pooler in transaction mode it never does); the listener is closed unless it did."""
        self._probe = asyncio.Event()
        try:
            sender = await connect(self._target)
            try:
                await sender.execute("SELECT pg_notify($1, $2)", self.channel, PROBE)
            finally:
                await sender.close()
            async with asyncio.timeout(PROBE_SECONDS):
                await self._probe.wait()
        except BaseException as error:
            await self._drop_listener()
            if not isinstance(error, TimeoutError):
                raise
            self._probed = True
            return False
        finally:
            self._probe = None
        self._probed = True
        return True

    def _lost_message(self) -> str:
        return (
            f"{self._target.location}: a notification did not reach the listening connection in {PROBE_SECONDS:g} s:"
            " the pooler does not pool sessions; use ?pooler=transaction (woken by polling)"
        )

    async def _drop_listener(self) -> None:
        listener, self._listener = self._listener, None
        if listener is not None:
            listener.remove_termination_listener(self._on_lost)
            with contextlib.suppress(*DRIVER_ERRORS):
                await listener.close(timeout=5)

    async def _relisten_within(self, timeout: float) -> None:
        """Try to listen again (at most once a second), waiting at most ``timeout`` for it: the attempt (a connection,
        and the check behind a session pooler) runs in a task of its own, so a wait that ends or is cancelled
        first does not cut it."""
        if self._relistening is None or self._relistening.done():
            if time.monotonic() < self._next_try:
                return
            self._next_try = time.monotonic() + RETRY_SECONDS
            self._relistening = asyncio.ensure_future(self._relisten())
        await asyncio.wait({self._relistening}, timeout=timeout)

    async def _relisten(self) -> None:
        try:
            self._listener = await self._listen()
            if self._closed:
                await self._drop_listener()
                return
            if not self._probed and not await self._delivered():  # the pooler loses them: poll, said once
                self.mode = "poll"
                log.error("%s (polling for new %s from now on)", self._lost_message(), self._what)
                return
        except (StoreError, *DRIVER_ERRORS) as error:
            self.lost += 1
            log.warning(
                "%s: cannot listen for new %s (polling until it can): %s", self._target.location, self._what, error
            )
            return
        log.info("%s: listening for new %s%s", self._target.location, self._what, " again" if self.lost else "")
        self.notify()  # rows may have come while nobody listened

    def _on_notification(self, _conn: object, _pid: int, _channel: str, payload: object) -> None:
        if payload == PROBE:  # a store's check that notifications arrive, its own or another host's: no work
            if self._probe is not None:
                self._probe.set()
            return
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
