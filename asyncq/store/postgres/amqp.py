"""``PostgresAmqpStore``: the AMQP consumer's store port on PostgreSQL (``asyncq.store.port.amqp`` states the rules,
``asyncq.core.redelivery`` decides; this module only runs statements). Its tables (``amqp_schema``) live in the
store's schema beside the queue's, migrated as component ``amqp``.

A delivery's effect runs in one transaction on a pooled connection with its completion key, committed with
``synchronous_commit=on`` before the broker is answered; the effect is a synchronous function as on SQLite, run in
one of the store's effect threads (``effect_thread``, one per concurrent delivery).

**Once per key across hosts.** The key is claimed first, by ``INSERT … ON CONFLICT (key) DO NOTHING``: a consumer on
another host given the same message waits for the first one's transaction, then finds the key (a ``DUPLICATE``) if
it committed, or claims it itself if it rolled back (a consumer killed mid-effect leaves nothing: the server rolls
its transaction back when the connection drops).
"""

from __future__ import annotations

import asyncio
import json
from concurrent.futures import ThreadPoolExecutor

import asyncpg

from asyncq.core.redelivery import NO_KEY, deliveries_seen, error_note, limit_reason, parking_reason
from asyncq.store.port.amqp import DeadMessage, Delivery, DeliveryOutcome, Effect
from asyncq.store.postgres.amqp_schema import AMQP
from asyncq.store.postgres.connection import Connection, Target
from asyncq.store.postgres.effect_thread import EffectThread
from asyncq.store.postgres.pooled import PooledStore, one_row

CLAIM_KEY = """INSERT INTO {s}.amqp_completed (key, at_ms) VALUES ($1, $2)
ON CONFLICT (key) DO NOTHING RETURNING true"""
IS_FINISHED = """SELECT EXISTS (SELECT 1 FROM {s}.amqp_completed WHERE key = $1),
  EXISTS (SELECT 1 FROM {s}.amqp_dead WHERE key = $1)"""
COUNT_DELIVERY = """INSERT INTO {s}.amqp_attempts AS a (key, deliveries) VALUES ($1, greatest(2, $2::integer))
ON CONFLICT (key) DO UPDATE SET deliveries = greatest(a.deliveries + 1, $2::integer)
RETURNING deliveries, last_error"""
NOTE_ERROR = """INSERT INTO {s}.amqp_attempts (key, deliveries, last_error) VALUES ($1, 1, $2)
ON CONFLICT (key) DO UPDATE SET last_error = EXCLUDED.last_error"""
FORGET_KEY = """WITH attempts AS (DELETE FROM {s}.amqp_attempts WHERE key = $1)
DELETE FROM {s}.amqp_dead WHERE key = $1"""
PARK = """WITH parked AS (
  INSERT INTO {s}.amqp_dead (key, queue, body, headers, content_type, deliveries, reason, at_ms)
  VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
  ON CONFLICT (key) DO UPDATE SET deliveries = EXCLUDED.deliveries, reason = EXCLUDED.reason, at_ms = EXCLUDED.at_ms
)
DELETE FROM {s}.amqp_attempts WHERE key = $1"""
DEAD_COLUMNS = "seq, key, queue, body, headers, content_type, deliveries, reason, at_ms"
LIST_DEAD = f"SELECT {DEAD_COLUMNS} FROM {{s}}.amqp_dead ORDER BY seq"
SELECT_DEAD = f"SELECT {DEAD_COLUMNS} FROM {{s}}.amqp_dead WHERE seq = $1"
DELETE_DEAD = "DELETE FROM {s}.amqp_dead WHERE seq = $1 RETURNING true"


def _dead(row: asyncpg.Record) -> DeadMessage:
    seq, key, queue, body, headers, content_type, deliveries, reason, at_ms = row
    return DeadMessage(seq, key, queue, bytes(body), json.loads(headers), content_type, deliveries, reason, at_ms)


async def _count_delivery(
    conn: Connection, schema: str, key: str, seen: int
) -> DeliveryOutcome | tuple[int, str | None]:
    """A redelivery counted in its own transaction: ``DUPLICATE``/``PARKED`` if its key is finished already (the
    ack was lost), else its deliveries so far and its last error."""
    completed, dead = await one_row(conn, IS_FINISHED.format(s=schema), key)
    if completed:
        return DeliveryOutcome.DUPLICATE
    if dead:
        return DeliveryOutcome.PARKED
    deliveries, last_error = await one_row(conn, COUNT_DELIVERY.format(s=schema), key, seen)
    return int(deliveries), last_error


class PostgresAmqpStore(PooledStore):
    """The consumer store's port on PostgreSQL, with ``connections`` pooled connections and effect threads (one per
    concurrent delivery). Open with ``await PostgresAmqpStore.open(url, connections=n)``."""

    def __init__(self, target: Target, pool: asyncpg.Pool, connections: int) -> None:
        super().__init__(target, pool)
        self._effects = EffectThread("asyncq-amqp-effect", workers=connections)

    @classmethod
    async def open(cls, url: object, *, connections: int = 1) -> PostgresAmqpStore:
        """Open the consumer's tables in the schema the URL names (created and migrated if needed)."""
        target, pool = await cls.open_target(url, AMQP, size=connections)
        return cls(target, pool, connections)

    async def process(self, delivery: Delivery, effect: Effect, *, delivery_limit: int, now_ms: int) -> DeliveryOutcome:
        key = delivery.key
        if key is None:
            return await self._park(delivery, 1, NO_KEY, now_ms)
        deliveries = 1
        seen = deliveries_seen(delivery.redelivered, delivery.delivery_count)
        if seen is not None:
            counted = await self._write(_count_delivery, key, seen)
            if isinstance(counted, DeliveryOutcome):
                return counted
            deliveries, last_error = counted
            reason = limit_reason(delivery_limit, deliveries, last_error)
            if reason is not None:
                return await self._park(delivery, deliveries, reason, now_ms)
        try:
            outcome: DeliveryOutcome = await self._write(self._run_effect, delivery, key, effect, now_ms)
        except Exception as exc:  # the transaction rolled back; asyncq's one rule decides
            reason = parking_reason(exc, deliveries)
            if reason is not None:
                return await self._park(delivery, deliveries, reason, now_ms)
            await self._run(self._statement, NOTE_ERROR, key, error_note(exc))
            return DeliveryOutcome.RETRY
        return outcome

    async def _run_effect(
        self, conn: Connection, schema: str, delivery: Delivery, key: str, effect: Effect, now_ms: int
    ) -> DeliveryOutcome:
        if not await conn.fetchval(CLAIM_KEY.format(s=schema), key, now_ms):
            return DeliveryOutcome.DUPLICATE
        await self._effects.run(conn, effect, delivery)
        await conn.execute(FORGET_KEY.format(s=schema), key)
        return DeliveryOutcome.COMPLETED

    async def _park(self, delivery: Delivery, deliveries: int, reason: str, now_ms: int) -> DeliveryOutcome:
        values = (delivery.queue, delivery.body, delivery.headers_text(), delivery.content_type)
        await self._run(self._statement, PARK, delivery.key, *values, deliveries, reason, now_ms)
        return DeliveryOutcome.PARKED

    @staticmethod
    async def _statement(conn: Connection, schema: str, statement: str, *args: object) -> str:
        return await conn.execute(statement.format(s=schema), *args)

    async def dead_messages(self) -> list[DeadMessage]:
        async def read(conn: Connection, schema: str) -> list[DeadMessage]:
            return [_dead(row) for row in await conn.fetch(LIST_DEAD.format(s=schema))]

        dead: list[DeadMessage] = await self._run(read)
        return dead

    async def get_dead(self, seq: int) -> DeadMessage | None:
        async def read(conn: Connection, schema: str) -> DeadMessage | None:
            row = await conn.fetchrow(SELECT_DEAD.format(s=schema), seq)
            return None if row is None else _dead(row)

        dead: DeadMessage | None = await self._run(read)
        return dead

    async def forget_dead(self, seq: int) -> bool:
        async def forget(conn: Connection, schema: str) -> bool:
            return bool(await conn.fetchval(DELETE_DEAD.format(s=schema), seq))

        forgotten: bool = await self._run(forget)
        return forgotten

    async def close(self) -> None:
        await super().close()
        self._effects.close()


def read_dead_of_url(url: object) -> list[DeadMessage]:
    """Every parked message of the store the URL names, read synchronously (an event loop of its own, in a thread
    of its own, so that a caller inside a running loop can call it too)."""

    async def read() -> list[DeadMessage]:
        store = await PostgresAmqpStore.open(url)
        try:
            return await store.dead_messages()
        finally:
            await store.close()

    with ThreadPoolExecutor(1, thread_name_prefix="asyncq-amqp-dead") as pool:
        return pool.submit(asyncio.run, read()).result()
