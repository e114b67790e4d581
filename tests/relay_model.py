"""A plain-Python model of the product outbox, its one relay and an inbox receiver, from ``docs/outbox.md``.

The outbox's rows, the relay lease row, the inbox's rows and the receiver's effects, and what one relay pass
(``Relay.run_once``) does to them given the receiver's state: up or down, and which fault it answers with. Nothing
here imports the package's internals; the errors are named by their type's name.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple, TypeVar

from asyncq import Conflict

T = TypeVar("T")
WAITING = ("unsent", "alarm")


def canonical(body: object) -> str:
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)


class Settings(NamedTuple):
    """The relay's configuration the model needs (the test builds its ``Relay`` with the same values)."""

    batch: int
    lease_ms: int
    alarm_after: int
    base_ms: int
    cap_ms: int
    poll_ms: int


@dataclass
class Item:
    """One ``asyncq_outbox`` row; ``error`` is the type name at the front of ``last_error`` (or ``None``)."""

    seq: int
    id: str
    topic: str
    body: str
    created_at: int
    state: str = "unsent"
    attempts: int = 0
    budget_from: int = 0
    error: str | None = None
    next_attempt_at: int = 0
    sent_at: int | None = None


@dataclass
class Receiver:
    """The inbox receiver: up or down, the fault it answers with (for one id, or all), its rows and effects."""

    up: bool = True
    fault: str | None = None  # unavailable (503), refuse (422), lost-answer (applies, then 500), bad-ack
    target: str | None = None  # the one id the fault is for; None: every id
    rows: dict[str, list[Any]] = field(default_factory=dict)  # id -> [body, applied_at_ms, duplicates, conflicts]
    effects: list[str] = field(default_factory=list)

    def deliver(self, item: Item, now: int) -> str | None:
        """One POST of ``item``: the error type the relay sees, or ``None`` for a verified ACK."""
        if not self.up:
            return "Retryable"  # connection refused
        fault = self.fault if self.target in (None, item.id) else None
        if fault == "unavailable":
            return "Retryable"
        if fault == "refuse":
            return "Permanent"
        self.receive(item, now)
        return {"lost-answer": "Retryable", "bad-ack": "BadAck"}.get(fault or "")

    def receive(self, item: Item, now: int) -> None:
        row = self.rows.get(item.id)
        if row is None:
            self.rows[item.id] = [item.body, now, 0, 0]
            self.effects.append(item.id)
        else:
            row[2] += 1  # the same canonical body: the outbox never sends another one for an id


class Result(NamedTuple):
    """A ``RelayResult`` without its error text: ``error`` is the text's leading type name."""

    sent: int
    stopped: str
    head_id: str | None
    wait_ms: int
    error: str | None
    token: int | None


@dataclass
class Model:
    settings: Settings
    items: dict[str, Item] = field(default_factory=dict)
    lease: list[Any] = field(default_factory=lambda: [None, 0, None])  # owner, token, lease_until
    # Each relay object's lease as it believes it holds it, ``(owner, token)``, by owner; ``owner`` is the current one.
    held: dict[str, tuple[str, int] | None] = field(default_factory=lambda: {"relay-0": None})
    owner: str = "relay-0"
    receiver: Receiver = field(default_factory=Receiver)
    app: list[tuple[int, int]] = field(default_factory=list)
    audit: list[tuple[Any, ...]] = field(default_factory=list)  # (item_seq, *entry) per operator action
    next_seq: int = 1

    def trial(self, operation: Callable[[Model], T]) -> tuple[Model, T]:
        changed = copy.deepcopy(self)
        return changed, operation(changed)

    def add(self, item_id: str, body: Any, topic: str, now: int) -> bool:
        found, text = self.items.get(item_id), canonical(body)
        if found is not None:
            if (found.topic, found.body) != (topic, text):
                raise Conflict(item_id)
            return False
        self.items[item_id] = Item(self.next_seq, item_id, topic, text, now, next_attempt_at=now)
        self.next_seq += 1
        return True

    def retry(self, item_id: str, note: str, now: int) -> tuple[Any, ...]:
        """The operator's retry: an alarmed (or backing-off) item is due now with a fresh alarm budget, audited;
        the audit entry as ``(id, at_ms, action, from_state, note, reason, attempts, error, skipped, count)``."""
        item = self.items.get(item_id)
        if item is None or item.state not in WAITING:
            raise ValueError(f"{item_id} cannot be retried")
        entry = (item_id, now, "retry", item.state, note, None, item.attempts, item.error, [], 0)
        self.audit.append((item.seq, *entry))
        item.state, item.next_attempt_at, item.budget_from = "unsent", now, item.attempts
        return entry

    def release(self) -> None:
        """The current relay stops cleanly: its lease (if it still holds it) is freed; the token stays."""
        held = self.held.pop(self.owner)
        if held is not None and (self.lease[0], self.lease[1]) == held:
            self.lease[0] = self.lease[2] = None

    # -- one relay pass -----------------------------------------------------------------------------------------

    def run_once(self, now: int, relay: str | None = None) -> Result:
        """One pass of the relay ``relay`` (the current one by default): renew the lease it holds (by owner and
        token, even past its end if nobody took it), or take a free or expired one with the next token."""
        relay = relay or self.owner
        owner, token, until = self.lease
        mine = self.held[relay] is not None and (owner, token) == self.held[relay]
        if not mine and (owner is None or until <= now):
            self.lease[:2], mine = [relay, token + 1], True
        if not mine:
            self.held[relay] = None
            wait = max(1, min((until if until is not None else now) - now, self.settings.lease_ms))
            return Result(0, "not-leader", None, wait, None, token)
        self.lease[2], self.held[relay] = now + self.settings.lease_ms, (self.lease[0], self.lease[1])
        waiting = sorted((item for item in self.items.values() if item.state in WAITING), key=lambda i: i.seq)
        batch = [copy.copy(item) for item in waiting[: self.settings.batch]]  # read before the first send
        return self.dispatch(batch, now)._replace(token=self.lease[1])

    def dispatch(self, batch: list[Item], now: int) -> Result:
        """Deliver ``batch`` in order; each item is marked sent in the write that starts the next attempt, the last
        one after the loop. Stop at an alarmed or backing-off item, or at the first failure."""
        sent, previous, stop = 0, None, None
        for snapshot in batch:
            stop = self.blocked(snapshot, now)
            if stop is not None:
                break
            sent += self.mark_sent(previous, now)
            previous, item = None, self.items[snapshot.id]
            item.attempts += 1  # counted before the request goes out
            error = self.receiver.deliver(item, now)
            if error is not None:
                return self.fail(item, snapshot, error, sent, now)
            previous = item
        sent += self.mark_sent(previous, now)
        if stop is None:
            full = len(batch) == self.settings.batch
            stop = Result(0, "more" if full else "idle", None, 0 if full else self.settings.poll_ms, None, None)
        return stop._replace(sent=sent)

    def blocked(self, snapshot: Item, now: int) -> Result | None:
        if snapshot.state == "alarm":
            return Result(0, "alarm", snapshot.id, self.settings.poll_ms, snapshot.error, None)
        if snapshot.next_attempt_at > now:
            return Result(0, "backoff", snapshot.id, snapshot.next_attempt_at - now, snapshot.error, None)
        return None

    def mark_sent(self, item: Item | None, now: int) -> int:
        if item is None:
            return 0
        item.state, item.sent_at, item.error = "sent", now, None
        return 1

    def fail(self, item: Item, snapshot: Item, error: str, sent: int, now: int) -> Result:
        attempt = max(1, snapshot.attempts + 1 - snapshot.budget_from)
        delay = int(min(self.settings.cap_ms, self.settings.base_ms * 2 ** (min(attempt, 16) - 1)))
        if error == "Permanent":  # the one failure rule: a permanent error waits for nothing (it alarms at once)
            delay = 0
        item.error, item.next_attempt_at = error, now + delay
        if error == "Permanent" or item.attempts - item.budget_from >= self.settings.alarm_after:
            item.state = "alarm"
            return Result(sent, "alarm", item.id, self.settings.poll_ms, error, None)
        return Result(sent, "failed", item.id, delay, error, None)
