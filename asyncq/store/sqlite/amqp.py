"""The idempotent consumer's tables and its one rule for a delivery, as short SQLite transactions.

Three tables live beside the app's own in the same file (hence the ``asyncq_amqp_`` prefix):

* ``asyncq_amqp_completed(key)``: a key is written in the same transaction as the effect, so a key exists
  exactly when the effect committed;
* ``asyncq_amqp_attempts(key, deliveries, last_error)``: how often an unfinished key was delivered; written
  in its own transaction *before* the effect runs again, so a message that crashes the process is counted;
* ``asyncq_amqp_dead(key, …, reason)``: messages parked after too many deliveries or a ``Permanent``
  error, kept whole so that an operator can redrive them.

:func:`process_delivery` decides, for one delivery, whether the broker should get an ack or a requeue.
"""

from __future__ import annotations

import enum
import json
import sqlite3
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from asyncq.errors import Permanent
from asyncq.store.sqlite.connection import open_file, write_transaction

TABLES = (
    "CREATE TABLE IF NOT EXISTS asyncq_amqp_completed (key TEXT PRIMARY KEY, at_ms INTEGER NOT NULL)",
    """CREATE TABLE IF NOT EXISTS asyncq_amqp_attempts (key TEXT PRIMARY KEY,
  deliveries INTEGER NOT NULL, last_error TEXT)""",
    """CREATE TABLE IF NOT EXISTS asyncq_amqp_dead (seq INTEGER PRIMARY KEY AUTOINCREMENT, key TEXT UNIQUE,
  queue TEXT NOT NULL, body BLOB NOT NULL, headers TEXT NOT NULL, content_type TEXT,
  deliveries INTEGER NOT NULL, reason TEXT NOT NULL, at_ms INTEGER NOT NULL)""",
)

IS_COMPLETED = "SELECT 1 FROM asyncq_amqp_completed WHERE key = :key"
IS_DEAD = "SELECT 1 FROM asyncq_amqp_dead WHERE key = :key"
INSERT_COMPLETED = "INSERT OR IGNORE INTO asyncq_amqp_completed (key, at_ms) VALUES (:key, :now)"
COUNT_DELIVERY = """
INSERT INTO asyncq_amqp_attempts (key, deliveries) VALUES (:key, max(2, :seen))
ON CONFLICT (key) DO UPDATE SET deliveries = max(deliveries + 1, :seen)
RETURNING deliveries, last_error
"""
NOTE_ERROR = """
INSERT INTO asyncq_amqp_attempts (key, deliveries, last_error) VALUES (:key, 1, :error)
ON CONFLICT (key) DO UPDATE SET last_error = :error
"""
FORGET_ATTEMPTS = "DELETE FROM asyncq_amqp_attempts WHERE key = :key"
FORGET_DEAD = "DELETE FROM asyncq_amqp_dead WHERE key = :key"
PARK = """
INSERT INTO asyncq_amqp_dead (key, queue, body, headers, content_type, deliveries, reason, at_ms)
VALUES (:key, :queue, :body, :headers, :content_type, :deliveries, :reason, :now)
ON CONFLICT (key) DO UPDATE SET deliveries = excluded.deliveries, reason = excluded.reason,
  at_ms = excluded.at_ms
"""
LIST_DEAD = """
SELECT seq, key, queue, body, headers, content_type, deliveries, reason, at_ms
FROM asyncq_amqp_dead ORDER BY seq
"""
SELECT_DEAD = """
SELECT seq, key, queue, body, headers, content_type, deliveries, reason, at_ms
FROM asyncq_amqp_dead WHERE seq = :seq
"""
DELETE_DEAD = "DELETE FROM asyncq_amqp_dead WHERE seq = :seq"


class Outcome(enum.Enum):
    """What became of one delivery, and so what the broker is told."""

    COMPLETED = "completed"  # the effect and its key committed: ack
    DUPLICATE = "duplicate"  # the key was already completed: ack, the effect does not run again
    PARKED = "parked"  # parked as dead (delivery limit, Permanent, no key): ack
    RETRY = "retry"  # the effect failed: requeue (nack) for another delivery

    @property
    def acks(self) -> bool:
        """Whether the broker gets an ack (otherwise a requeueing nack)."""
        return self is not Outcome.RETRY


@dataclass(frozen=True)
class Delivery:
    """One delivery as the effect sees it, independent of the AMQP client."""

    key: str | None
    body: bytes
    queue: str
    redelivered: bool = False
    delivery_count: int | None = None  # a quorum queue's x-delivery-count: earlier returns of this message
    headers: Mapping[str, object] = field(default_factory=dict)
    content_type: str | None = None

    def json(self) -> object:
        """The body decoded as UTF-8 JSON."""
        return json.loads(self.body.decode("utf-8"))


#: The database effect: runs inside the transaction that writes the completion key; raise to roll back.
Effect = Callable[[sqlite3.Connection, Delivery], object]


@dataclass(frozen=True)
class DeadMessage:
    """A parked message, with the reason it was parked."""

    seq: int
    key: str | None
    queue: str
    body: bytes
    headers: dict[str, object]
    content_type: str | None
    deliveries: int
    reason: str
    at_ms: int


def open_store(path: object, *, check_same_thread: bool = True) -> sqlite3.Connection:
    """Open the SQLite file and create the consumer's tables if they are missing (rows are kept)."""
    return open_file(path, TABLES, journal_mode="WAL", timeout=5.0, check_same_thread=check_same_thread)


def process_delivery(
    con: sqlite3.Connection, delivery: Delivery, effect: Effect, *, delivery_limit: int, now: int
) -> Outcome:
    """Run ``effect`` for ``delivery`` at most once per key, and say what the broker should be told.

    A first delivery costs one transaction (effect + key). A repeat is first counted in its own committed
    transaction; past ``delivery_limit`` deliveries it is parked instead of run again.
    """
    key = delivery.key
    if key is None:
        return _park(con, delivery, 1, "no message id to use as completion key", now)
    deliveries = 1
    if delivery.redelivered or delivery.delivery_count:
        with write_transaction(con):
            if con.execute(IS_COMPLETED, {"key": key}).fetchone() is not None:
                return Outcome.DUPLICATE
            if con.execute(IS_DEAD, {"key": key}).fetchone() is not None:
                return Outcome.PARKED  # parked before, but the ack was lost
            seen = (delivery.delivery_count or 0) + 1
            deliveries, last_error = con.execute(COUNT_DELIVERY, {"key": key, "seen": seen}).fetchone()
        if deliveries > delivery_limit:
            reason = f"delivery limit {delivery_limit} exceeded ({deliveries} deliveries)"
            return _park(con, delivery, deliveries, f"{reason}; last error: {last_error or 'none seen'}", now)
    return _run_effect(con, delivery, key, effect, deliveries, now)


def _run_effect(
    con: sqlite3.Connection, delivery: Delivery, key: str, effect: Effect, deliveries: int, now: int
) -> Outcome:
    try:
        with write_transaction(con):
            if con.execute(INSERT_COMPLETED, {"key": key, "now": now}).rowcount == 0:
                return Outcome.DUPLICATE
            effect(con, delivery)
            con.execute(FORGET_ATTEMPTS, {"key": key})
            con.execute(FORGET_DEAD, {"key": key})
    except Permanent as exc:
        return _park(con, delivery, deliveries, f"permanent: {exc}", now)
    except Exception as exc:
        with write_transaction(con):
            con.execute(NOTE_ERROR, {"key": key, "error": f"{type(exc).__name__}: {exc}"[:500]})
        return Outcome.RETRY
    return Outcome.COMPLETED


def _park(con: sqlite3.Connection, delivery: Delivery, deliveries: int, reason: str, now: int) -> Outcome:
    params = {
        "key": delivery.key,
        "queue": delivery.queue,
        "body": delivery.body,
        "headers": json.dumps(dict(delivery.headers), default=str),
        "content_type": delivery.content_type,
        "deliveries": deliveries,
        "reason": reason,
        "now": now,
    }
    with write_transaction(con):
        con.execute(PARK, params)
        con.execute(FORGET_ATTEMPTS, {"key": delivery.key})
    return Outcome.PARKED


def list_dead(con: sqlite3.Connection) -> list[DeadMessage]:
    """Every parked message, oldest first."""
    return [_dead(row) for row in con.execute(LIST_DEAD)]


def get_dead(con: sqlite3.Connection, seq: int) -> DeadMessage | None:
    """The parked message ``seq``, or ``None``."""
    row = con.execute(SELECT_DEAD, {"seq": seq}).fetchone()
    return None if row is None else _dead(row)


def forget_dead(con: sqlite3.Connection, seq: int) -> bool:
    """Remove parked message ``seq`` (after it was republished); ``False`` if it was not there."""
    with write_transaction(con):
        return con.execute(DELETE_DEAD, {"seq": seq}).rowcount == 1


def _dead(row: tuple[Any, ...]) -> DeadMessage:
    seq, key, queue, body, headers, content_type, deliveries, reason, at_ms = row
    return DeadMessage(seq, key, queue, bytes(body), json.loads(headers), content_type, deliveries, reason, at_ms)
