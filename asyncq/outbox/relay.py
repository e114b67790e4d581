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
:meth:`Outbox.requeue`, all audited). The SQL and the state moves live in :mod:`asyncq.store.sqlite.outbox`;
``docs/outbox.md`` ("The product relay") draws them.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import sqlite3
from collections.abc import Iterable
from contextlib import AbstractAsyncContextManager
from dataclasses import replace
from typing import Any

import aiohttp
import anyio

from asyncq.core.clock import Clock, wall_clock_ms
from asyncq.core.values import check_identifier, check_int
from asyncq.delivery.base import Transport
from asyncq.delivery.http import check_url
from asyncq.errors import Permanent
from asyncq.store.sqlite import outbox as store
from asyncq.store.sqlite.aio import AppTransaction, AsyncFile
from asyncq.store.sqlite.durability import DEFAULT, LEVELS
from asyncq.store.sqlite.outbox import AuditEntry, Figures, Item, NewItem, ReceiverFigures, RelayResult, add_sync
from asyncq.worker.pool import RetryPolicy

__all__ = [
    "AuditEntry",
    "Figures",
    "Item",
    "Outbox",
    "OutboxTransaction",
    "ReceiverFigures",
    "Relay",
    "RelayResult",
    "add_sync",
    "receiver_figures",
]

log = logging.getLogger("asyncq.outbox")
ALARM_LOG = "outbox item %s is in alarm after %d attempts (%s): nothing behind it moves until an operator acts"


class OutboxTransaction(AppTransaction):
    """An open ``BEGIN IMMEDIATE`` on the outbox's connection: the app's SQL and its items commit together."""

    _file: Outbox

    async def add(self, item_id: str, body: Any, topic: str = store.DEFAULT_TOPIC) -> bool:
        """Add an item inside this transaction (see :meth:`Outbox.add`)."""
        item = NewItem.check(item_id, body, topic)
        added = await self._run_step(store.add_in_transaction, item, self._file.now())
        self.added += added
        return added


class Outbox(AsyncFile):
    """The outbox tables in one SQLite file, beside the app's own. Open with ``await Outbox.open(path)``."""

    @classmethod
    async def open(
        cls, path: str, *, durability: str = DEFAULT.name, clock: Clock = wall_clock_ms, busy_timeout: float = 5.0
    ) -> Outbox:
        """Open (creating the outbox tables if missing) ``path``; ``durability`` as for ``Queue.open``."""
        level = LEVELS.get(durability)
        if level is None:
            raise ValueError(f"durability must be one of {sorted(LEVELS)}")
        setup = functools.partial(store.open_tables, journal_mode=level.journal_mode, synchronous=level.synchronous)
        conn, file = await cls._connect(path, busy_timeout, setup)
        return cls(conn, file, clock)

    async def add(self, item_id: str, body: Any, topic: str = store.DEFAULT_TOPIC) -> bool:
        """Add one item in its own transaction: ``True``; the same id, topic and body again → ``False``;
        the same id with another topic or body → ``Conflict``."""
        added: bool = await self._run(store.add, NewItem.check(item_id, body, topic), self.now())
        if added:
            self._notify()
        return added

    def transaction(self) -> AbstractAsyncContextManager[OutboxTransaction]:
        """``async with outbox.transaction() as tx``: ``tx.execute`` the app's SQL and ``tx.add`` items; all
        commit together, or all roll back if the block raises (or is cancelled)."""
        return self._transaction(OutboxTransaction(self))

    async def get(self, item_id: str) -> Item | None:
        """One item's stored record (``body`` is its canonical JSON text), or ``None``."""
        found: Item | None = await self._run(store.get_item, check_identifier(item_id, "item_id"))
        return found

    async def retry(self, item_id: str, note: str) -> AuditEntry:
        """Operator: clear an alarm (or cut a backoff short): the item is unsent and due now, its attempts
        kept and a fresh budget of attempts before the next alarm. Audited; ``ValueError`` if the item is not
        in ``alarm`` or ``unsent``."""
        return await self._operate(item_id, "retry", note, None)

    async def quarantine(self, item_id: str, reason: str, note: str) -> AuditEntry:
        """Operator: take an unsent or alarmed item out of the order (it is *not* sent). The audit row keeps
        ``reason`` and the ids of the waiting items behind it, which now go first."""
        return await self._operate(item_id, "quarantine", note, store.check_text(reason, "reason"))

    async def requeue(self, item_id: str, note: str) -> AuditEntry:
        """Operator: put a quarantined item back at its own ``seq`` (ahead of everything still waiting), with
        a fresh budget. The audit row lists the items that were sent ahead of it while it was out."""
        return await self._operate(item_id, "requeue", note, None)

    async def _operate(self, item_id: str, action: str, note: str, reason: str | None) -> AuditEntry:
        checked = check_identifier(item_id, "item_id")
        entry: AuditEntry = await self._run(
            store.operator_move, checked, action, self.now(), store.check_text(note, "note"), reason
        )
        log.info("outbox %s %s by operator (%s)", action, checked, note)
        self._notify()
        return entry

    async def audit(self, item_id: str | None = None) -> list[AuditEntry]:
        """The operator actions on one item, or on all items, oldest first."""
        key = None if item_id is None else check_identifier(item_id, "item_id")
        entries: list[AuditEntry] = await self._run(store.read_audit, key)
        return entries

    async def figures(self) -> Figures:
        """Unsent count, oldest unsent age, the head item's id, state and attempts, and the relay lease."""
        now = self.now()
        figures: Figures = await self._run(store.read_figures, now)
        return figures


async def receiver_figures(
    stats_url: str, *, allowed_hosts: Iterable[str] | None = None, timeout: float = 5.0
) -> ReceiverFigures:
    """Read an ``asyncq.inbox`` receiver's durable counts from its ``GET …/events/stats`` URL (loopback hosts
    only unless ``allowed_hosts`` says otherwise); ``ValueError`` if the answer is not those counts."""
    url = check_url(stats_url, allowed_hosts)
    limits = aiohttp.ClientTimeout(total=timeout)
    async with (
        aiohttp.ClientSession(trust_env=False, timeout=limits) as session,
        session.get(url, allow_redirects=False) as response,
    ):
        if response.status != 200:
            raise ValueError(f"{url.host} answered {response.status} for its stats")
        return ReceiverFigures.from_stats(await response.json())


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
        self.owner = check_identifier(owner or store.default_owner(), "owner")
        self.batch = check_int(batch, "batch", 1, 1000)
        self.lease_ms = check_int(lease_ms, "lease_ms", 3, 24 * 3600 * 1000)
        self.alarm_after = check_int(alarm_after, "alarm_after", 1, 1_000_000)
        self.retry = retry or RetryPolicy()
        self.poll_ms = check_int(poll_ms, "poll_ms", 1, 3_600_000)
        self.stats_url = None if stats_url is None else str(check_url(stats_url))
        self._lease: store.Lease | None = None
        self._wake = asyncio.Event()
        self._stopping = False
        self._reported: dict[str, tuple[object, ...]] = {}

    # -- one pass -----------------------------------------------------------------------------------------------

    async def run_once(self) -> RelayResult:
        """Hold the lease, then deliver the head batch in order, marking each item sent after its ACK;
        stop at the first failure (stored with the item) or at an alarmed or backing-off head item."""
        now = self.outbox.now()
        lease, mine = await self.outbox._run(store.hold_lease, self._lease, self.owner, now, self.lease_ms)
        self._lease = lease if mine else None
        self._report("lease", (mine, lease.token), logging.INFO, "outbox lease token %d: %s", lease.token, lease.owner)
        if not mine:
            until = lease.lease_until if lease.lease_until is not None else now
            return RelayResult(0, store.NOT_LEADER, wait_ms=max(1, min(until - now, self.lease_ms)), token=lease.token)
        batch: list[Item] = await self.outbox._run(store.head_batch, self.batch)
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
                return RelayResult(sent, store.LEASE_LOST, item.id)
            if not step.started:
                stop = RelayResult(0, store.CHANGED, item.id)
                break
            error = await self._deliver(item)
            if error is not None:
                return await self._fail(item, error, sent)
            previous = item
        if previous is not None:
            step = await self._advance(previous, None)
            if step.lease is None:
                return RelayResult(sent, store.LEASE_LOST, previous.id)
            sent += step.marked
            self._delivered(previous)
        if stop is None:
            full = len(batch) == self.batch
            stop = RelayResult(0, store.MORE if full else store.IDLE, wait_ms=0 if full else self.poll_ms)
        return replace(stop, sent=sent)

    def _blocked(self, item: Item) -> RelayResult | None:
        """Why the relay must not deliver ``item`` now: an alarm, a backoff, or a stop request."""
        if self._stopping:
            return RelayResult(0, store.STOPPING, item.id)
        if item.state == store.ALARM:
            return self._alarm(item.id, item.attempts, item.last_error, 0)
        wait = item.next_attempt_at - self.outbox.now()
        if wait > 0:
            return RelayResult(0, store.BACKOFF, item.id, wait_ms=wait, error=item.last_error)
        return None

    async def _advance(self, sent: Item | None, start: int | None) -> store.Step:
        assert self._lease is not None
        seq = None if sent is None else sent.seq
        step: store.Step = await self.outbox._run(
            store.advance, self._lease, self.outbox.now(), self.lease_ms, seq, start
        )
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
            if await self.outbox._run(store.renew_lease, self._lease, self.outbox.now(), self.lease_ms) is None:
                return  # lost: the next fenced write finds out and stops

    async def _fail(self, item: Item, error: Exception, sent: int) -> RelayResult:
        assert self._lease is not None
        text = f"{type(error).__name__}: {error}"[: store.TEXT_MAX]
        now = self.outbox.now()
        delay = self.retry.delay_ms(max(1, item.attempts + 1 - item.budget_from), error)
        failure = store.Failure(text, now + delay, isinstance(error, Permanent), self.alarm_after)
        lease, state = await self.outbox._run(store.record_failure, self._lease, now, self.lease_ms, item.seq, failure)
        self._lease = lease
        if lease is None:
            return RelayResult(sent, store.LEASE_LOST, item.id, error=text)
        if state == store.ALARM:
            return self._alarm(item.id, item.attempts + 1, text, sent)
        self._report(
            "head", (item.id, store.FAILED), logging.WARNING, "outbox item %s failed (%s): retrying", item.id, text
        )
        return RelayResult(sent, store.FAILED, item.id, wait_ms=delay, error=text)

    def _alarm(self, item_id: str, attempts: int, error: str | None, sent: int) -> RelayResult:
        self._report("head", (item_id, store.ALARM), logging.WARNING, ALARM_LOG, item_id, attempts, error)
        return RelayResult(sent, store.ALARM, item_id, wait_ms=self.poll_ms, error=error)

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
                except sqlite3.OperationalError as exc:  # busy or locked: try again later, loudly
                    log.warning("outbox relay %s: %s", self.owner, exc)
                    result = RelayResult(0, store.FAILED, wait_ms=self.poll_ms)
                await self._pause(result.wait_ms)
        finally:
            self.outbox._waiters.discard(self._wake)
            await self.release()

    async def _pause(self, wait_ms: int) -> None:
        if wait_ms > 0 and not self._stopping:
            with anyio.move_on_after(wait_ms / 1000):
                await self._wake.wait()

    def stop(self) -> None:
        """Ask :meth:`run` to finish: the delivery in flight completes and is recorded, nothing new starts."""
        self._stopping = True
        self._wake.set()

    async def release(self) -> None:
        """Give the lease up (if held) so that another relay takes over at once; :meth:`run` does it on exit."""
        lease, self._lease = self._lease, None
        if lease is not None:
            with anyio.CancelScope(shield=True):
                await self.outbox._run(store.release_lease, lease)

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
