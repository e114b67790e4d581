"""The transactional outbox and its relay: an app's rows and its outgoing events commit together, and one
relay per outbox delivers them in ``seq`` order, marking each sent only after a verified ACK.

    outbox = await Outbox.open("app.db")
    async with outbox.transaction() as tx:
        await tx.execute("INSERT INTO orders (id, qty) VALUES (?, ?)", ("o-7", 7))
        await tx.add("o-7", {"id": "o-7", "qty": 7}, topic="orders")
    relay = Relay(outbox, HttpTransport("http://127.0.0.1:8080/events"))
    await relay.run()  # until relay.stop()

The relay stops at the first failure (order is kept), stores the attempt count, the error and the next
attempt time with the item, and puts a head item that keeps failing into ``alarm``: nothing behind it moves
until an operator retries or quarantines it (:meth:`Outbox.retry`, :meth:`Outbox.quarantine`,
:meth:`Outbox.requeue`, all audited). The relay talks to the outbox's store only through its port
(``asyncq.store.port.outbox``, which draws the state moves; ``docs/outbox.md``, "The product relay", too).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import secrets
import socket
from dataclasses import dataclass, replace

import aiohttp
import anyio

from asyncq.core.backoff import RetryPolicy
from asyncq.core.failures import classify
from asyncq.core.lifecycle import PERMANENT
from asyncq.core.values import check_identifier, check_int
from asyncq.delivery.base import Transport
from asyncq.delivery.http import check_url
from asyncq.outbox.outbox import Outbox, receiver_figures
from asyncq.store.port.outbox import ALARM, TEXT_MAX, Failure, Figures, Item, Lease, Step

log = logging.getLogger("asyncq.outbox")
ALARM_LOG = "outbox item %s is in alarm after %d attempts (%s): nothing behind it moves until an operator acts"

# Why a relay pass stopped (``alarm`` is the state's name).
IDLE, MORE, FAILED, BACKOFF = "idle", "more", "failed", "backoff"
NOT_LEADER, LEASE_LOST, CHANGED, STOPPING = "not-leader", "lease-lost", "changed", "stopping"


@dataclass(frozen=True)
class RelayResult:
    """One ``Relay.run_once``: how many items it marked sent, why it stopped (``idle``, ``more``, ``failed``,
    ``backoff``, ``alarm``, ``not-leader``, ``lease-lost``, ``changed``, ``stopping``), the head item it
    stopped at, how long to wait before the next pass, the delivery error if any, and the lease token."""

    sent: int
    stopped: str
    head_id: str | None = None
    wait_ms: int = 0
    error: str | None = None
    token: int | None = None


def default_owner() -> str:
    """A relay owner name unique to this process and object: host, pid and random bits."""
    host = "".join(c if c.isalnum() or c in "-_" else "-" for c in socket.gethostname())[:30] or "host"
    return f"relay-{host}-{os.getpid()}-{secrets.token_hex(4)}"


# --- the relay ---------------------------------------------------------------------------------------------------


class Relay:
    """Delivers an outbox's items in ``seq`` order through ``transport`` (one ``deliver`` method: returns
    only on a verified ACK). One relay per outbox holds the fenced lease; another one waits.

    ``alarm_after`` failed attempts put the head item in alarm (a ``Permanent`` error at once); ``retry``
    paces the attempts before that (capped, jittered backoff; a receiver's ``Retry-After`` wins).
    ``stats_url`` is the receiver's ``GET …/events/stats``, read by :meth:`figures`."""

    def __init__(
        self,
        outbox: Outbox,
        transport: Transport,
        *,
        owner: str | None = None,
        batch: int = 16,
        lease_ms: int = 10_000,
        alarm_after: int = 5,
        retry: RetryPolicy | None = None,
        poll_ms: int = 1000,
        stats_url: str | None = None,
    ) -> None:
        self.outbox = outbox
        self.transport = transport
        self.owner = check_identifier(owner or default_owner(), "owner")
        self.batch = check_int(batch, "batch", 1, 1000)
        self.lease_ms = check_int(lease_ms, "lease_ms", 3, 24 * 3600 * 1000)
        self.alarm_after = check_int(alarm_after, "alarm_after", 1, 1_000_000)
        self.retry = retry or RetryPolicy()
        self.poll_ms = check_int(poll_ms, "poll_ms", 1, 3_600_000)
        self.stats_url = None if stats_url is None else str(check_url(stats_url))
        self._lease: Lease | None = None
        self._wake = asyncio.Event()
        self._stopping = False
        self._reported: dict[str, tuple[object, ...]] = {}

    # -- one pass -----------------------------------------------------------------------------------------------

    async def run_once(self) -> RelayResult:
        """Hold the lease, then deliver the head batch in order, marking each item sent after its ACK;
        stop at the first failure (stored with the item) or at an alarmed or backing-off head item."""
        now = self.outbox.now()
        lease, mine = await self.outbox.store.hold_lease(self._lease, self.owner, now, self.lease_ms)
        self._lease = lease if mine else None
        self._report("lease", (mine, lease.token), logging.INFO, "outbox lease token %d: %s", lease.token, lease.owner)
        if not mine:
            until = lease.lease_until if lease.lease_until is not None else now
            return RelayResult(0, NOT_LEADER, wait_ms=max(1, min(until - now, self.lease_ms)), token=lease.token)
        batch = await self.outbox.store.head_batch(self.batch)
        result = await self._dispatch(batch)
        return replace(result, token=lease.token)

    async def _dispatch(self, batch: list[Item]) -> RelayResult:
        sent, previous, stop = 0, None, None
        for item in batch:
            stop = self._blocked(item)
            if stop is not None:
                break
            step = await self._advance(previous, item.seq)
            sent += step.marked
            previous = None
            if step.lease is None:
                return RelayResult(sent, LEASE_LOST, item.id)
            if not step.started:
                stop = RelayResult(0, CHANGED, item.id)
                break
            error = await self._deliver(item)
            if error is not None:
                return await self._fail(item, error, sent)
            previous = item
        if previous is not None:
            step = await self._advance(previous, None)
            if step.lease is None:
                return RelayResult(sent, LEASE_LOST, previous.id)
            sent += step.marked
            self._delivered(previous)
        if stop is None:
            full = len(batch) == self.batch
            stop = RelayResult(0, MORE if full else IDLE, wait_ms=0 if full else self.poll_ms)
        return replace(stop, sent=sent)

    def _blocked(self, item: Item) -> RelayResult | None:
        """Why the relay must not deliver ``item`` now: an alarm, a backoff, or a stop request."""
        if self._stopping:
            return RelayResult(0, STOPPING, item.id)
        if item.state == ALARM:
            return self._alarm(item.id, item.attempts, item.last_error, 0)
        wait = item.next_attempt_at - self.outbox.now()
        if wait > 0:
            return RelayResult(0, BACKOFF, item.id, wait_ms=wait, error=item.last_error)
        return None

    async def _advance(self, sent: Item | None, start: int | None) -> Step:
        assert self._lease is not None
        seq = None if sent is None else sent.seq
        step = await self.outbox.store.advance(self._lease, self.outbox.now(), self.lease_ms, seq, start)
        self._lease = step.lease
        if step.lease is None:
            log.warning("outbox relay %s lost its lease: it marks nothing more", self.owner)
        return step

    async def _deliver(self, item: Item) -> Exception | None:
        """Deliver with the lease kept alive meanwhile; the error, or ``None`` on a verified ACK."""
        keeper = asyncio.create_task(self._keep_lease())
        try:
            await self.transport.deliver(item.id, json.loads(item.body), {"Asyncq-Topic": item.topic})
        except Exception as exc:
            return exc
        finally:
            keeper.cancel()
            await asyncio.wait([keeper])
        return None

    async def _keep_lease(self) -> None:
        """Renew (never re-acquire) the lease every third of its length while a delivery is in flight."""
        while self._lease is not None:
            await asyncio.sleep(self.lease_ms / 3000)
            if await self.outbox.store.renew_lease(self._lease, self.outbox.now(), self.lease_ms) is None:
                return  # lost: the next fenced write finds out and stops

    async def _fail(self, item: Item, error: Exception, sent: int) -> RelayResult:
        assert self._lease is not None
        text = f"{type(error).__name__}: {error}"[:TEXT_MAX]
        now = self.outbox.now()
        outcome, delay = classify(error, max(1, item.attempts + 1 - item.budget_from), self.retry)
        failure = Failure(text, now + delay, outcome == PERMANENT, self.alarm_after)
        lease, state = await self.outbox.store.record_failure(self._lease, now, self.lease_ms, item.seq, failure)
        self._lease = lease
        if lease is None:
            return RelayResult(sent, LEASE_LOST, item.id, error=text)
        if state == ALARM:
            return self._alarm(item.id, item.attempts + 1, text, sent)
        self._report("head", (item.id, FAILED), logging.WARNING, "outbox item %s failed (%s): retrying", item.id, text)
        return RelayResult(sent, FAILED, item.id, wait_ms=delay, error=text)

    def _alarm(self, item_id: str, attempts: int, error: str | None, sent: int) -> RelayResult:
        self._report("head", (item_id, ALARM), logging.WARNING, ALARM_LOG, item_id, attempts, error)
        return RelayResult(sent, ALARM, item_id, wait_ms=self.poll_ms, error=error)

    def _delivered(self, item: Item) -> None:
        reported = self._reported.get("head")
        if reported is not None and reported[0] == item.id:
            log.info("outbox item %s delivered after %d attempts", item.id, item.attempts + 1)
            del self._reported["head"]

    def _report(self, slot: str, key: tuple[object, ...], level: int, message: str, *args: object) -> None:
        """Log once per change of ``key`` (a state) in ``slot``, not once per poll; repeats go to debug."""
        log.log(level if self._reported.get(slot) != key else logging.DEBUG, message, *args)
        self._reported[slot] = key

    # -- the loop -----------------------------------------------------------------------------------------------

    async def run(self) -> None:
        """:meth:`run_once` until :meth:`stop`, waiting as each result says (woken early by this process's
        adds and operator actions); the lease is released on the way out."""
        self._stopping = False
        self.outbox._waiters.add(self._wake)
        try:
            while not self._stopping:
                self._wake.clear()
                try:
                    result = await self.run_once()
                except self.outbox.store.busy_errors as exc:  # busy or locked: try again later, loudly
                    log.warning("outbox relay %s: %s", self.owner, exc)
                    result = RelayResult(0, FAILED, wait_ms=self.poll_ms)
                await self._pause(result.wait_ms)
        finally:
            self.outbox._waiters.discard(self._wake)
            await self.release()

    async def _pause(self, wait_ms: int) -> None:
        """Up to ``wait_ms``, until this process adds items (or stops the relay), or the store hears that another
        connection did (on PostgreSQL, its ``NOTIFY``; else, or while it cannot hear, the poll)."""
        if wait_ms <= 0 or self._stopping or self._wake.is_set():
            return
        seconds = wait_ms / 1000
        local = asyncio.ensure_future(self._wake.wait())
        heard = asyncio.ensure_future(self.outbox.store.wait_for_items(seconds))
        try:
            await asyncio.wait([local, heard], timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
            if heard.done() and not heard.cancelled() and heard.exception() is not None:
                log.warning("outbox relay %s: cannot wait for other hosts' items: %r", self.owner, heard.exception())
                await asyncio.wait([local], timeout=seconds)  # the poll, woken by this process only
        finally:
            for waiting in (local, heard):
                waiting.cancel()
            await asyncio.gather(local, heard, return_exceptions=True)

    def stop(self) -> None:
        """Ask :meth:`run` to finish: the delivery in flight completes and is recorded, nothing new starts."""
        self._stopping = True
        self._wake.set()

    async def release(self) -> None:
        """Give the lease up (if held) so that another relay takes over at once; :meth:`run` does it on exit."""
        lease, self._lease = self._lease, None
        if lease is not None:
            with anyio.CancelScope(shield=True):
                await self.outbox.store.release_lease(lease)

    async def figures(self) -> Figures:
        """The outbox's figures plus, if ``stats_url`` was given, the receiver's duplicates and conflicts
        (``receiver_error`` says why they are missing if the receiver could not be read)."""
        figures = await self.outbox.figures()
        if self.stats_url is None:
            return figures
        try:
            return replace(figures, receiver=await receiver_figures(self.stats_url))
        except (aiohttp.ClientError, OSError, ValueError) as exc:
            return replace(figures, receiver_error=f"{type(exc).__name__}: {exc}")
