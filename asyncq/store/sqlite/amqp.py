"""``SqliteAmqpStore``: the AMQP consumer's store port on one SQLite file (``asyncq.store.port.amqp`` states the
rules), as short SQLite transactions.

Three tables live beside the app's own in the same file (hence the ``asyncq_amqp_`` prefix):

* ``asyncq_amqp_completed(key)``: a key is written in the same transaction as the effect, so a key exists
  exactly when the effect committed;
* ``asyncq_amqp_attempts(key, deliveries, last_error)``: how often an unfinished key was delivered; written
  in its own transaction *before* the effect runs again, so a message that crashes the process is counted;
* ``asyncq_amqp_dead(key, …, reason)``: messages parked after too many deliveries or a ``Permanent``
  error, kept whole so that an operator can redrive them.

:func:`process_delivery` decides, for one delivery, whether the broker should get an ack or a requeue. The
store runs it on one of its connections, each with a thread of its own (``asyncq.store.sqlite.aio.FilePool``).
"""

from __future__ import annotations

import functools
import json
import sqlite3
from typing import Any

from asyncq.core.redelivery import NO_KEY, deliveries_seen, error_note, limit_reason, parking_reason
from asyncq.store.port.amqp import DeadMessage, Delivery, DeliveryOutcome, Effect
from asyncq.store.sqlite.aio import FilePool
from asyncq.store.sqlite.connection import check_path, configure, open_file, write_transaction
from asyncq.store.sqlite.effects import effect_transaction

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


BUSY_TIMEOUT_S = 5.0


def open_store(path: object, *, check_same_thread: bool = True) -> sqlite3.Connection:
    """Open the SQLite file and create the consumer's tables if they are missing (rows are kept)."""
    return open_file(path, TABLES, journal_mode="WAL", timeout=BUSY_TIMEOUT_S, check_same_thread=check_same_thread)


def process_delivery(
    con: sqlite3.Connection, delivery: Delivery, effect: Effect, *, delivery_limit: int, now: int
) -> DeliveryOutcome:
    """Run ``effect`` for ``delivery`` at most once per key, and say what the broker should be told.

    A first delivery costs one transaction (effect + key). A repeat is first counted in its own committed
    transaction; past ``delivery_limit`` deliveries it is parked instead of run again.
    """
    key = delivery.key
    if key is None:
        return _park(con, delivery, 1, NO_KEY, now)
    deliveries = 1
    seen = deliveries_seen(delivery.redelivered, delivery.delivery_count)
    if seen is not None:
        with write_transaction(con):
            if con.execute(IS_COMPLETED, {"key": key}).fetchone() is not None:
                return DeliveryOutcome.DUPLICATE
            if con.execute(IS_DEAD, {"key": key}).fetchone() is not None:
                return DeliveryOutcome.PARKED  # parked before, but the ack was lost
            deliveries, last_error = con.execute(COUNT_DELIVERY, {"key": key, "seen": seen}).fetchone()
        reason = limit_reason(delivery_limit, deliveries, last_error)
        if reason is not None:
            return _park(con, delivery, deliveries, reason, now)
    return _run_effect(con, delivery, key, effect, deliveries, now)


def _run_effect(
    con: sqlite3.Connection, delivery: Delivery, key: str, effect: Effect, deliveries: int, now: int
) -> DeliveryOutcome:
    try:
        with write_transaction(con):
            if con.execute(INSERT_COMPLETED, {"key": key, "now": now}).rowcount == 0:
                return DeliveryOutcome.DUPLICATE
            with effect_transaction(con) as tx:
                effect(tx, delivery)
            con.execute(FORGET_ATTEMPTS, {"key": key})
            con.execute(FORGET_DEAD, {"key": key})
    except Exception as exc:  # asyncq's one rule; a retry is a requeue, at once (the broker has no delay)
        reason = parking_reason(exc, deliveries)
        if reason is not None:
            return _park(con, delivery, deliveries, reason, now)
        with write_transaction(con):
            con.execute(NOTE_ERROR, {"key": key, "error": error_note(exc)})
        return DeliveryOutcome.RETRY
    return DeliveryOutcome.COMPLETED


def _park(con: sqlite3.Connection, delivery: Delivery, deliveries: int, reason: str, now: int) -> DeliveryOutcome:
    params = {
        "key": delivery.key,
        "queue": delivery.queue,
        "body": delivery.body,
        "headers": delivery.headers_text(),
        "content_type": delivery.content_type,
        "deliveries": deliveries,
        "reason": reason,
        "now": now,
    }
    with write_transaction(con):
        con.execute(PARK, params)
        con.execute(FORGET_ATTEMPTS, {"key": delivery.key})
    return DeliveryOutcome.PARKED


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


def read_dead(path: object) -> list[DeadMessage]:
    """Every parked message in the file at ``path`` (its tables created if missing), on a connection of its own."""
    con = open_store(path)
    try:
        return list_dead(con)
    finally:
        con.close()


def _open_tables(con: sqlite3.Connection) -> None:
    configure(con, "WAL", "FULL")
    with write_transaction(con):
        for statement in TABLES:
            con.execute(statement)


class SqliteAmqpStore:
    """The consumer store's port on one SQLite file, with ``connections`` connections (one per concurrent
    delivery). Open with ``await SqliteAmqpStore.open(path, connections=n)``."""

    def __init__(self, pool: FilePool, location: str) -> None:
        self._pool = pool
        self.location = location

    @classmethod
    async def open(cls, path: object, *, connections: int = 1) -> SqliteAmqpStore:
        """Open ``connections`` connections to ``path`` (the consumer's tables created if missing, rows kept)."""
        file = check_path(path, "database")
        return cls(await FilePool.open(file, connections, BUSY_TIMEOUT_S, _open_tables), file)

    async def process(self, delivery: Delivery, effect: Effect, *, delivery_limit: int, now_ms: int) -> DeliveryOutcome:
        run = functools.partial(process_delivery, delivery_limit=delivery_limit, now=now_ms)
        outcome: DeliveryOutcome = await self._pool.run(run, delivery, effect)
        return outcome

    async def dead_messages(self) -> list[DeadMessage]:
        dead: list[DeadMessage] = await self._pool.run(list_dead)
        return dead

    async def get_dead(self, seq: int) -> DeadMessage | None:
        dead: DeadMessage | None = await self._pool.run(get_dead, seq)
        return dead

    async def forget_dead(self, seq: int) -> bool:
        forgotten: bool = await self._pool.run(forget_dead, seq)
        return forgotten

    async def close(self) -> None:
        await self._pool.close()
