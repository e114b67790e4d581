"""``Outbox``: the transactional outbox's facade over an outbox store (``asyncq.store.port.outbox``). An app's rows
and its outgoing items commit together; ``asyncq.outbox.relay`` delivers them in order.

The facade checks every argument, reads the injected clock, and hands the store only checked values and
``now``. Tasks of this process waiting for items (a ``Relay.run``) are woken after an add or an operator's
action; other processes' items are found by polling.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Iterable, Sequence
from contextlib import asynccontextmanager
from typing import Any

import aiohttp

from asyncq.core.clock import Clock, wall_clock_ms
from asyncq.core.values import check_identifier
from asyncq.delivery.http import check_url
from asyncq.store.facade import StoreFacade
from asyncq.store.opening import open_outbox_store
from asyncq.store.port.outbox import (
    DEFAULT_TOPIC,
    TEXT_MAX,
    Figures,
    Item,
    NewItem,
    OutboxAuditEntry,
    OutboxStore,
    OutboxStoreTransaction,
    ReceiverFigures,
)

log = logging.getLogger("asyncq.outbox")


def check_text(value: object, name: str) -> str:
    """Free text for notes and reasons: 1-500 printable characters."""
    if type(value) is not str or not 0 < len(value) <= TEXT_MAX or not value.isprintable():
        raise ValueError(f"{name} must be a str of 1-{TEXT_MAX} printable characters")
    return value


class OutboxTransaction:
    """An open transaction of the outbox's store: the app's SQL (``execute``) and its items (``add``) commit
    together. Usable only inside its ``async with`` block."""

    def __init__(self, outbox: Outbox, inner: OutboxStoreTransaction) -> None:
        self._outbox = outbox
        self._inner = inner
        self.added = 0

    async def execute(self, statement: str, parameters: Sequence[Any] | dict[str, Any] = ()) -> list[Any]:
        """Run one statement of the app's own and return its rows, in the store's dialect (SQLite: ``?`` or
        ``:name`` parameters; PostgreSQL: ``$1``, ``$2`` … from a list or tuple)."""
        return await self._inner.execute(statement, parameters)

    async def add(self, item_id: str, body: Any, topic: str = DEFAULT_TOPIC) -> bool:
        """Add an item inside this transaction (see :meth:`Outbox.add`)."""
        added = await self._inner.add(NewItem.check(item_id, body, topic), self._outbox.now())
        self.added += added
        return added


class Outbox(StoreFacade[OutboxStore]):
    """The outbox of one store, beside the app's own tables. Open with ``await Outbox.open(path)`` (a SQLite file)
    or ``await Outbox.open("postgresql://…")``."""

    def __init__(self, store: OutboxStore, clock: Clock = wall_clock_ms) -> None:
        super().__init__(store, clock)
        self._waiters: set[asyncio.Event] = set()  # set after this process adds items (a relay's wake-up)

    @classmethod
    async def open(
        cls, path: str, *, durability: str = "full", clock: Clock = wall_clock_ms, busy_timeout: float = 5.0
    ) -> Outbox:
        """Open (creating the outbox tables if missing) ``path``, a SQLite file or a ``postgresql://`` URL (its
        schema as for ``Queue.open``, migrated as the component ``outbox``); ``durability`` as for ``Queue.open``."""
        if not callable(clock):
            raise TypeError("clock must be a callable returning epoch milliseconds")  # before the file is made
        return cls(await open_outbox_store(path, durability=durability, busy_timeout=busy_timeout), clock)

    def notify(self) -> None:
        """Wake the tasks of this process waiting for items."""
        for event in self._waiters:
            event.set()

    async def add(self, item_id: str, body: Any, topic: str = DEFAULT_TOPIC, *, connection: Any = None) -> bool:
        """Add one item in its own transaction: ``True``; the same id, topic and body again → ``False``;
        the same id with another topic or body → ``Conflict``.

        ``connection``: on PostgreSQL, the app's own asyncpg connection with its transaction open (``async with
        conn.transaction(): … await outbox.add(…, connection=conn)``): the item commits or rolls back with the
        app's rows. On SQLite, use ``transaction()`` (or ``asyncq.sqlite.add_sync`` on the app's ``sqlite3``
        connection)."""
        item = NewItem.check(item_id, body, topic)
        if connection is not None:  # the relays are woken at the app's commit, by the store's NOTIFY
            return await self.store.add(item, self.now(), connection=connection)
        added = await self.store.add(item, self.now())
        if added:
            self.notify()
        return added

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[OutboxTransaction]:
        """``async with outbox.transaction() as tx``: ``tx.execute`` the app's SQL and ``tx.add`` items; all
        commit together, or all roll back if the block raises (or is cancelled)."""
        async with self.store.transaction() as inner:
            tx = OutboxTransaction(self, inner)
            yield tx
        if tx.added:
            self.notify()

    async def get(self, item_id: str) -> Item | None:
        """One item's stored record (``body`` is its canonical JSON text), or ``None``."""
        return await self.store.get(check_identifier(item_id, "item_id"))

    async def retry(self, item_id: str, note: str) -> OutboxAuditEntry:
        """Operator: clear an alarm (or cut a backoff short): the item is unsent and due now, its attempts
        kept and a fresh budget of attempts before the next alarm. Audited; ``ValueError`` if the item is not
        in ``alarm`` or ``unsent``."""
        return await self._operate(item_id, "retry", note, None)

    async def quarantine(self, item_id: str, reason: str, note: str) -> OutboxAuditEntry:
        """Operator: take an unsent or alarmed item out of the order (it is *not* sent). The audit row keeps
        ``reason`` and the ids of the waiting items behind it, which now go first."""
        return await self._operate(item_id, "quarantine", note, check_text(reason, "reason"))

    async def requeue(self, item_id: str, note: str) -> OutboxAuditEntry:
        """Operator: put a quarantined item back at its own ``seq`` (ahead of everything still waiting), with
        a fresh budget. The audit row lists the items that were sent ahead of it while it was out."""
        return await self._operate(item_id, "requeue", note, None)

    async def _operate(self, item_id: str, action: str, note: str, reason: str | None) -> OutboxAuditEntry:
        checked = check_identifier(item_id, "item_id")
        entry = await self.store.operate(checked, action, self.now(), check_text(note, "note"), reason)
        log.info("outbox %s %s by operator (%s)", action, checked, note)
        self.notify()
        return entry

    async def audit(self, item_id: str | None = None) -> list[OutboxAuditEntry]:
        """The operator actions on one item, or on all items, oldest first."""
        key = None if item_id is None else check_identifier(item_id, "item_id")
        return await self.store.audit(key)

    async def figures(self) -> Figures:
        """Unsent count, oldest unsent age, the head item's id, state and attempts, and the relay lease."""
        return await self.store.figures(self.now())


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
