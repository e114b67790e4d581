"""The outbox store's port: what ``asyncq.outbox.Outbox`` and its ``Relay`` ask of a store, and the values that
cross it.

An item moves only along these edges (``docs/outbox.md`` draws them)::

    [add] ──► unsent ──(verified ACK, fenced)──► sent
              unsent ──(failure, budget spent or Permanent, fenced)──► alarm
              alarm  ──(retry: operator, audited)──► unsent
    unsent | alarm ──(quarantine: operator, audited with the items that now go first)──► quarantined
       quarantined ──(requeue: operator, audited with the items that went first)──► unsent

What every outbox store must guarantee:

- **Order.** Items are delivered in ``seq`` (insertion) order; ``head_batch`` returns the waiting items
  (``unsent`` or ``alarm``) lowest ``seq`` first. ``seq`` order is commit order: an item never becomes visible
  behind one that was already sent (on SQLite, writers are serial; on PostgreSQL, adds take an order lock).
- **Atomic with the app.** ``transaction()`` commits the app's statements and its items together, or neither;
  ``add`` of an existing id with the same topic and body is ``False`` (the row is kept), with another ``Conflict``.
- **Fenced relay writes.** Starting an attempt, marking sent and recording a failure happen in one transaction
  with a renewal of the relay's lease by owner and token, so a relay that lost its lease changes nothing. The
  lease is taken only when free or expired, always with a new token (``token + 1``); one relay per store.
- **Audited operator moves.** ``operate`` moves an item along ``OPERATOR_MOVES`` and writes its audit row in the
  same transaction; ``ValueError`` (nothing changes) for a missing item or one in another state.
- **One snapshot.** ``figures`` reads every figure in one read transaction, so they agree.
- **Time from the caller.** Every ``now_ms`` is the caller's clock; a store never reads a clock of its own.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Any, Protocol

from asyncq.core.jobs import MAX_BODY_BYTES, body_text
from asyncq.core.values import check_identifier

UNSENT, SENT, ALARM, QUARANTINED = "unsent", "sent", "alarm", "quarantined"
DEFAULT_TOPIC = "default"
# action: (the states it moves an item from, the state it moves it to)
OPERATOR_MOVES = {
    "retry": ((ALARM, UNSENT), UNSENT),
    "quarantine": ((UNSENT, ALARM), QUARANTINED),
    "requeue": ((QUARANTINED,), UNSENT),
}
#: The longest note, reason or error text a store keeps.
TEXT_MAX = 500
#: Ids listed in one audit row; ``skipped_count`` is always exact.
AUDIT_IDS_MAX = 1000


@dataclass(frozen=True)
class NewItem:
    """An item to add, checked: an identifier id and topic, and the body as canonical JSON text."""

    id: str
    topic: str
    body: str

    @classmethod
    def check(cls, item_id: object, body: object, topic: object) -> NewItem:
        """``ValueError`` for a bad id or topic, or a body that is not JSON or over 64 KiB."""
        return cls(check_identifier(item_id, "id"), check_identifier(topic, "topic"), body_text(body, MAX_BODY_BYTES))


@dataclass(frozen=True)
class Item:
    """One stored outbox item; ``body`` is its canonical JSON text."""

    seq: int
    id: str
    topic: str
    body: str
    created_at: int
    state: str
    attempts: int
    budget_from: int
    last_error: str | None
    next_attempt_at: int
    sent_at: int | None


@dataclass(frozen=True)
class Lease:
    """The relay lease as stored: ``owner`` is ``None`` when free; ``token`` is the fence."""

    owner: str | None
    token: int
    lease_until: int | None


@dataclass(frozen=True)
class Step:
    """What one fenced relay write did: the renewed lease (``None``: lost, nothing changed), whether the
    delivered item was marked sent, and whether the next item's attempt was counted (it is unsent and due)."""

    lease: Lease | None
    marked: bool
    started: bool


@dataclass(frozen=True)
class Failure:
    """A failed delivery to record: the error text, when to try again, and whether to alarm at once."""

    error: str
    next_attempt_at: int
    permanent: bool
    alarm_after: int


@dataclass(frozen=True)
class OutboxAuditEntry:
    """One operator action on an outbox item (a job's is ``asyncq.core.jobs.AuditEntry``): ``skipped_ahead_of``
    lists (up to 1000) ids that go, or went, before this item."""

    id: str
    at_ms: int
    action: str
    from_state: str
    note: str
    reason: str | None
    attempts: int
    last_error: str | None
    skipped_ahead_of: list[str]
    skipped_count: int

    @classmethod
    def from_row(cls, row: Sequence[Any]) -> OutboxAuditEntry:
        """A stored audit row: its columns in this class's order, ``skipped_ahead_of`` as JSON text."""
        item_id, at_ms, action, from_state, note, reason, attempts, last_error, skipped, count = row
        return cls(item_id, at_ms, action, from_state, note, reason, attempts, last_error, json.loads(skipped), count)


@dataclass(frozen=True)
class ReceiverFigures:
    """The receiver's durable inbox counts (``GET …/events/stats``, its ``table`` part)."""

    applied: int
    duplicates: int
    conflicts: int

    @classmethod
    def from_stats(cls, answer: object) -> ReceiverFigures:
        """The counts from an ``asyncq.inbox`` stats answer; ``ValueError`` if they are not there."""
        table = answer.get("table") if type(answer) is dict else None
        found = [table.get(name) for name in ("applied", "duplicates", "conflicts")] if type(table) is dict else []
        counts = [count for count in found if type(count) is int]
        if len(counts) != 3:
            raise ValueError("the receiver did not answer with inbox counts")
        return cls(*counts)


@dataclass(frozen=True)
class Figures:
    """What an operator watches. ``unsent`` counts the items waiting (states ``unsent`` and ``alarm``, of
    which ``alarmed`` in alarm); ``alarm`` is true when the head item is in alarm; ``quarantined`` items are
    not sent and are counted apart. ``receiver`` is filled by ``Relay.figures`` when it knows the receiver."""

    now_ms: int
    unsent: int
    alarm: bool
    alarmed: int
    quarantined: int
    oldest_unsent_age_ms: int | None
    head_id: str | None
    head_state: str | None
    head_attempts: int
    head_last_error: str | None
    lease_owner: str | None
    lease_token: int
    lease_until: int | None
    receiver: ReceiverFigures | None = None
    receiver_error: str | None = None


class OutboxStoreTransaction(Protocol):
    """An open transaction of an outbox store, in which the app's statements and its items commit together."""

    async def execute(self, statement: str, parameters: Sequence[Any] | dict[str, Any] = ()) -> list[Any]:
        """Run one statement of the app's own and return its rows."""
        ...

    async def add(self, item: NewItem, now_ms: int) -> bool:
        """Add an item inside this transaction (``OutboxStore.add``'s rule)."""
        ...


class OutboxStore(Protocol):
    """An outbox's storage. Every method is one transaction; arguments are already checked by the facade."""

    #: Where the store lives, for messages (a file path, a URL without its password).
    location: str
    #: What the store raises when it cannot be used for now (busy, locked, a lost connection): worth trying again.
    busy_errors: tuple[type[Exception], ...]

    # -- the app ------------------------------------------------------------------------------------------

    async def add(self, item: NewItem, now_ms: int, *, connection: Any = None) -> bool:
        """Add an unsent item: ``True``; the same id, topic and body again: ``False``; else ``Conflict``.
        ``connection``: an app's own connection to the store's database with its transaction open, to add in (the
        item then commits or rolls back with the app's rows); a store that cannot join one raises ``TypeError``."""
        ...

    def transaction(self) -> AbstractAsyncContextManager[OutboxStoreTransaction]:
        """A transaction for the app's statements and items: committed when the block ends, rolled back if it
        raises or is cancelled."""
        ...

    # -- operators ----------------------------------------------------------------------------------------

    async def get(self, item_id: str) -> Item | None:
        """One item's stored record, or ``None``."""
        ...

    async def operate(self, item_id: str, action: str, now_ms: int, note: str, reason: str | None) -> OutboxAuditEntry:
        """Move the item along ``OPERATOR_MOVES[action]`` (a fresh budget: ``budget_from = attempts``; due at
        ``now_ms``) with its audit row, which is returned. ``quarantine`` records the waiting ids behind it,
        ``requeue`` the ids sent behind it while it was out."""
        ...

    async def audit(self, item_id: str | None) -> list[OutboxAuditEntry]:
        """The audit rows of one item (or of all items), oldest first."""
        ...

    async def figures(self, now_ms: int) -> Figures:
        """Counts by state, the oldest waiting item's age, the head item and the lease, in one read."""
        ...

    # -- the relay ----------------------------------------------------------------------------------------

    async def hold_lease(self, held: Lease | None, owner: str, now_ms: int, lease_ms: int) -> tuple[Lease, bool]:
        """Renew ``held`` if it is still ours, else take the lease if free or expired (token + 1): the lease as
        stored afterwards and whether it is ours."""
        ...

    async def renew_lease(self, lease: Lease, now_ms: int, lease_ms: int) -> Lease | None:
        """Extend ``lease`` if it still holds (same owner and token); ``None`` if it was lost. Never acquires."""
        ...

    async def release_lease(self, lease: Lease) -> bool:
        """Free the lease if ``lease`` still holds it (the token stays, so the next holder gets a new one)."""
        ...

    async def head_batch(self, limit: int) -> list[Item]:
        """Up to ``limit`` waiting items (``unsent`` or ``alarm``) in ``seq`` order."""
        ...

    async def wait_for_items(self, timeout: float) -> None:
        """Return when another connection (another process or host) may have added items, or after ``timeout``
        seconds: the relay's poll. This process's own adds wake its relays through the facade."""
        ...

    async def advance(self, lease: Lease, now_ms: int, lease_ms: int, sent: int | None, start: int | None) -> Step:
        """Fenced: mark item ``sent`` (a seq, after its verified ACK) sent, and count an attempt on item ``start``
        (if it is unsent and due) before it is delivered. If the lease was lost, nothing changes."""
        ...

    async def record_failure(
        self, lease: Lease, now_ms: int, lease_ms: int, seq: int, failure: Failure
    ) -> tuple[Lease | None, str | None]:
        """Fenced: store the error and the next attempt time; ``alarm`` once ``attempts - budget_from`` reaches
        ``alarm_after``, or at once if ``permanent``. The renewed lease (``None`` if lost) and the new state."""
        ...

    async def close(self) -> None:
        """Close the store (after the transaction in progress)."""
        ...
