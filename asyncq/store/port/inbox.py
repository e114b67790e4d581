"""The inbox store's port: what ``asyncq.inbox.Inbox`` asks of a store.

What every inbox store must guarantee:

- **One write transaction per batch.** ``record`` writes every event of its batch in one transaction (one
  durable commit: the inbox's group commit) and returns only after that commit is durable at the store's
  level (SQLite: WAL with ``synchronous=FULL``; PostgreSQL: ``synchronous_commit=on``), so an answer sent after it
  never acknowledges a lost effect.
- **Each event alone.** An event whose effect raises is rolled back alone (its inbox row and every row its
  effect wrote: a savepoint) and gets its exception as its result; the others still commit. A
  failure of the transaction itself raises, and nothing of the batch is kept.
- **Once per id.** A new id gets its row (with ``now_ms``) and its effect: ``'applied'``. A known id with the
  same canonical body counts a duplicate (``'duplicate'``), with another body a conflict (``'conflict'``);
  neither runs the effect.
- **The effect inside.** The effect runs synchronously in that transaction, in the store's writer thread (on
  PostgreSQL its effect thread), and is handed an ``EffectTransaction`` (``asyncq.store.port.effects``), never the
  driver's connection.
- **Once across processes.** Receivers in several processes (hosts) on one store still apply an id once: one
  of them records it, the others find it (and wait for the first one's transaction to end if they must).
- **Time from the caller.** ``now_ms`` is the caller's clock; a store never reads a clock of its own.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from asyncq.store.port.effects import EffectTransaction

#: The user's effect for an inbox event, run inside the event's write transaction: ``effect(tx, event_id, body)``.
InboxEffect = Callable[[EffectTransaction, str, Any], None]

#: What ``record`` gives each event: ``'applied'``, ``'duplicate'``, ``'conflict'``, or its effect's exception.
InboxResult = str | Exception


@dataclass(frozen=True)
class InboxEvent:
    """One event to record: its id (checked), its body as canonical JSON text, and the body itself (for the
    effect)."""

    id: str
    canonical: str
    body: Any


@dataclass(frozen=True)
class InboxTotals:
    """The durable counts: rows (``applied``), and the sums of their ``duplicates`` and ``conflicts``."""

    applied: int
    duplicates: int
    conflicts: int


class InboxStore(Protocol):
    """An inbox's storage. Arguments are already checked by the facade."""

    #: Where the store lives, for messages (a file path, a URL without its password).
    location: str

    async def record(self, events: Sequence[InboxEvent], now_ms: int, effect: InboxEffect | None) -> list[InboxResult]:
        """Record ``events`` in one write transaction (see the module's rules); one result per event, in order."""
        ...

    async def totals(self) -> InboxTotals:
        """The durable counts, in one read."""
        ...

    async def close(self) -> None:
        """Close the store (after the batch being written)."""
        ...
